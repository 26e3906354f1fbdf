"""The speculative draft's rules hold whatever the weights figure's source (issue 39 item 3): a figure given
with --weights-gib (or a fixed --budget-gib, or a preset) does not make a draft the server cannot build
start green.

Kimi-K3 under EAGLE/NEXTN without a draft of its own is refused on the architecture alone (no release has
a NEXTN class for it: the draft worker builds the target whole again, tp_worker.py:466-480); the target's
``mtp.*`` tensors and a separate draft directory are held from the headers under --weights-gib too.
Checkpoints are sparse safetensors of real config.json shapes (Qwen3-Next cut to 4 layers and 16 experts,
every tensor at its real shape), written in well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.preflight.verdict import decide
from tests.checkpoints import model_dir, mtp_tensors
from tests.test_weights_commands import check_rows

FIXTURES = Path(__file__).parent / "fixtures"
KIMI_K3 = json.loads((FIXTURES / "kimi_k3_config.json").read_text())
QWEN3_NEXT = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
SMALL = dict(QWEN3_NEXT, num_hidden_layers=4, num_experts=16, num_experts_per_tok=4)
EAGLE3 = json.loads((FIXTURES / "weights/eagle3_qwen3_next_draft.json").read_text())
V = ["--sglang-version", "0.5.23"]
REFUSED = "no NEXTN/MTP draft class for Kimi-K3"


@pytest.fixture(scope="module")
def k3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi-K3 model directory with config.json only (its text config declaring one NEXTN layer)."""
    d = tmp_path_factory.mktemp("k3") / "Kimi-K3"
    d.mkdir()
    config = json.loads(json.dumps(KIMI_K3))
    config["text_config"]["num_nextn_predict_layers"] = 1
    (d / "config.json").write_text(json.dumps(config))
    return d


def _one_line(code: int, out: str, err: str, words: str) -> None:
    assert code == 2 and out == "", err
    line = err.strip()
    assert "\n" not in line and words in line, line


@pytest.mark.parametrize(
    "argv",
    [
        # derive: the budget the server gets, from a figure given as a number
        ["derive", "--gpu-free-gib", "139", "--weights-gib", "40", *V, "--", "--mem-fraction-static", "0.85"],
        # derive at a fixed budget, and as NEXTN
        ["derive", "--budget-gib", "40", *V, "--", "--speculative-algorithm", "NEXTN"],
        # plan's fraction from --weights-gib
        [
            "plan",
            "--target-max-running-requests",
            "48",
            "--gpu-free-gib",
            "139",
            "--weights-gib",
            "40",
            *V,
            "--",
        ],  # fmt: skip
    ],
    ids=["derive-weights-gib", "derive-budget-gib-nextn", "plan-weights-gib"],
)
def test_kimi_k3_under_eagle_is_refused_whatever_the_weights_source(
    argv: list[str], k3_dir: Path, cli: Callable[..., Any]
) -> None:
    launch = ["--model-path", str(k3_dir), "--tp-size", "8"]
    if "--speculative-algorithm" not in argv:
        launch += ["--speculative-algorithm", "EAGLE"]
    code, out, err = cli([*argv, *launch])
    _one_line(code, out, err, REFUSED)
    assert "KimiK3ForConditionalGeneration whole" in err and "kimi_k3.py:3199-3205" in err
    # the same deployment without speculative decoding is sized
    plain = [w for w in [*argv, *launch] if w not in ("NEXTN", "EAGLE", "--speculative-algorithm")]
    code, out, err = cli(plain)
    assert code == 0, err


def test_kimi_k3_refused_for_a_preset_and_its_own_directory_as_the_draft(
    k3_dir: Path, cli: Callable[..., Any]
) -> None:
    """The preset has no directory at all; a draft path that is the target's directory is the target's
    own checkpoint (SGLang builds the same class from it)."""
    code, out, err = cli(["derive", "--budget-gib", "40", *V, "--model", "kimi-k3", "--tp-size", "8",
                          "--speculative-algorithm", "EAGLE"])  # fmt: skip
    _one_line(code, out, err, REFUSED)
    launch = ["--model-path", str(k3_dir), "--tp-size", "8", "--speculative-algorithm", "EAGLE"]
    code, out, err = cli(["derive", "--budget-gib", "40", *V, "--", *launch,
                          "--speculative-draft-model-path", str(k3_dir)])  # fmt: skip
    _one_line(code, out, err, REFUSED)


def test_check_refuses_kimi_k3_under_eagle_with_weights_gib_on_every_rank(k3_dir: Path) -> None:
    """check's rows, in-process as each node builds them: --weights-gib read no directory, and still each
    rank's row is the one-line refusal (exit 2); without speculative decoding the same rows are sized."""
    words = ["check", "--budget-from-device", "--device-free-gib", "139", "--weights-gib", "40",
             "--timeout-s", "20", "--backend", "gloo"]  # fmt: skip
    launch = ["--model-path", str(k3_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    rows = check_rows(words, [*launch, "--speculative-algorithm", "EAGLE"], world_size=2)
    for row in rows:
        assert REFUSED in row.error and "\n" not in row.error, row.error
    assert decide(rows, world_size=2).exit_code == 2
    rows = check_rows(words, launch, world_size=2)
    assert [r.status for r in rows] == [0, 0], rows[0].error
    assert decide(rows, world_size=2).exit_code == 0


def _qwen(path: Path, *, mtp: bool) -> Path:
    config = path.parent / f"{path.name}.json"
    config.write_text(json.dumps(SMALL))
    return model_dir(path, config, shards=2, extra=mtp_tensors(SMALL) if mtp else [])


def test_the_targets_mtp_tensors_are_held_under_weights_gib(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A figure given as a number: the shards are not read for it, but the draft EAGLE/NEXTN loads from
    them still is (Qwen3NextForCausalLMMTP keeps only 'mtp' names, qwen3_next.py:1173-1184: none leaves it
    on uninitialised memory). The headers alone are read."""
    argv = ["derive", "--gpu-free-gib", "139", "--weights-gib", "20", *V, "--"]
    spec = ["--tp-size", "2", "--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"]
    code, out, err = cli([*argv, "--model-path", str(_qwen(tmp_path / "bare", mtp=False)), *spec])
    _one_line(code, out, err, "no mtp.* tensor")
    code, out, err = cli([*argv, "--model-path", str(_qwen(tmp_path / "whole", mtp=True)), *spec])
    assert code == 0, err


def test_a_separate_draft_is_held_under_weights_gib(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A draft path that is no model directory, and an EAGLE3 draft of two layers on 0.5.10 (which
    refuses it: llama_eagle3.py:212-213), are one line under --weights-gib as under the checkpoint."""
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(SMALL))
    argv = ["derive", "--gpu-free-gib", "139", "--weights-gib", "20", "--sglang-version"]
    launch = ["--model-path", str(target), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
    code, out, err = cli([*argv, "0.5.23", "--", *launch, *spec, str(tmp_path / "missing")])
    _one_line(code, out, err, "not a model directory")
    two = tmp_path / "eagle3"
    two.mkdir()
    (two / "config.json").write_text(json.dumps(dict(EAGLE3, num_hidden_layers=2)))
    code, out, err = cli([*argv, "0.5.10", "--", *launch, *spec, str(two)])
    _one_line(code, out, err, "EAGLE3 currently only supports 1 layer")
    code, out, err = cli([*argv, "0.5.23", "--", *launch, *spec, str(two)])
    assert code == 0, err


# ---- draft_source: where each rank's draft bytes came from -----------------------------------------------


def _per_rank(cli: Callable[..., Any], argv: list[str]) -> list[dict[str, Any]]:
    code, out, err = cli(argv)
    assert code == 0, err
    return list(json.loads(out)["weights"]["per_rank"])


def test_draft_source_in_derive_and_plan_json(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """Per rank, beside draft_bytes: the target's MTP layer from its shards or its config.json alone, a
    separate draft from its shards or its config.json, inside a --weights-gib figure, or loaded after the
    pool is sized (0.5.13); null without a draft."""
    whole = _qwen(tmp_path / "whole", mtp=True)
    bare = tmp_path / "config-only"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps(SMALL))
    eagle3 = tmp_path / "eagle3"
    eagle3.mkdir()
    (eagle3 / "config.json").write_text(json.dumps(EAGLE3))
    base = ["--tp-size", "2", "--mem-fraction-static", "0.85"]
    derive = ["derive", "--gpu-free-gib", "139", "--format", "json", "--sglang-version"]
    nextn = ["--speculative-algorithm", "EAGLE"]
    separate = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(eagle3)]
    cases = [
        ([*derive, "0.5.23", "--", "--model-path", str(whole), *base, *nextn], "target-mtp"),
        ([*derive, "0.5.23", "--", "--model-path", str(bare), *base, *nextn], "target-config"),
        ([*derive, "0.5.23", "--", "--model-path", str(whole), *base, *separate], "config"),
        ([*derive, "0.5.13", "--", "--model-path", str(whole), *base, *nextn, "--disable-radix-cache"],
         "after-pool"),
        ([*derive, "0.5.23", "--weights-gib", "30", "--", "--model-path", str(whole), *base, *nextn],
         "weights-gib"),
        ([*derive, "0.5.23", "--", "--model-path", str(whole), *base], None),
    ]  # fmt: skip
    for argv, want in cases:
        ranks = _per_rank(cli, argv)
        assert [r["draft_source"] for r in ranks] == [want, want], argv
        if want in ("target-mtp", "target-config", "config"):
            assert all(r["draft_bytes"] > 0 for r in ranks)
        if want == "after-pool":
            assert all(r["draft_bytes"] == 0 for r in ranks)
    plan = ["plan", "--target-max-running-requests", "48", "--gpu-free-gib", "139", "--format", "json",
            "--sglang-version", "0.5.23"]  # fmt: skip
    code, out, err = cli([*plan, "--weights-gib", "30", "--", "--model-path", str(whole), *base[:2], *nextn])
    assert code == 0, err
    assert [r["draft_source"] for r in json.loads(out)["weights"]["per_rank"]] == ["weights-gib"] * 2
    code, out, err = cli([*plan, "--", "--model-path", str(whole), *base[:2], *nextn])
    assert code == 0, err
    assert [r["draft_source"] for r in json.loads(out)["weights"]["per_rank"]] == ["target-mtp"] * 2
    # and the text says it
    text = ["derive", "--gpu-free-gib", "139", "--sglang-version", "0.5.23", "--weights-gib", "30", "--"]
    code, out, err = cli([*text, "--model-path", str(whole), *base, *nextn])
    assert code == 0 and "(--weights-gib, the speculative draft inside it)" in out, err


def test_draft_source_in_checks_report_and_text(tmp_path: Path) -> None:
    """check's rows carry draft_source over the wire (schema 15): the report's ranks[] and the text's
    weights cell name it; a rank that loads no draft has null."""
    from checker.outputs.report import to_json, to_text

    whole = _qwen(tmp_path / "whole", mtp=True)
    words = [
        "check",
        "--budget-from-device",
        "--device-free-gib",
        "139",
        "--timeout-s",
        "20",
        "--backend",
        "gloo",
    ]
    launch = ["--model-path", str(whole), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    verdict = decide(
        check_rows(words, [*launch, "--speculative-algorithm", "EAGLE"], world_size=2), world_size=2
    )
    ranks = to_json(verdict, extra={})["ranks"]
    assert isinstance(ranks, list) and [r["draft_source"] for r in ranks] == ["target-mtp"] * 2
    assert "GiB from target-mtp)" in to_text(verdict, summary="", elapsed_s=1.0)
    flag = ["--weights-gib", "30"]
    verdict = decide(
        check_rows([*words, *flag], [*launch, "--speculative-algorithm", "EAGLE"], world_size=2), world_size=2
    )
    assert [r["draft_source"] for r in to_json(verdict, extra={})["ranks"]] == ["weights-gib"] * 2
    assert "(flag, draft inside the figure (weights-gib))" in to_text(verdict, summary="", elapsed_s=1.0)
    verdict = decide(check_rows(words, launch, world_size=2), world_size=2)
    assert [r["draft_source"] for r in to_json(verdict, extra={})["ranks"]] == [None, None]


# ---- the other families with no NEXTN/MTP class (Kimi-Linear, Falcon-H1, Granite-4.0-H; Nemotron-H to 0.5.7)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """config.json-only model directories of the real configs."""
    out = {}
    for name in ("kimi_linear_48b_a3b", "falcon_h1_0_5b", "granite_4_0_h_small", "nemotron_h_8b"):
        d = tmp_path_factory.mktemp(name) / name
        d.mkdir()
        (d / "config.json").write_text((FIXTURES / f"{name}.json").read_text())
        out[name] = d
    return out


@pytest.mark.parametrize(
    ("name", "arch", "release"),
    [
        ("kimi_linear_48b_a3b", "KimiLinearForCausalLM", "0.5.23"),
        ("kimi_linear_48b_a3b", "KimiLinearForCausalLM", "0.5.10"),
        ("falcon_h1_0_5b", "FalconH1ForCausalLM", "0.5.23"),
        ("granite_4_0_h_small", "GraniteMoeHybridForCausalLM", "0.5.23"),
        ("nemotron_h_8b", "NemotronHForCausalLM", "0.5.7"),
    ],
)
@pytest.mark.parametrize("command", ["derive", "plan"])
def test_families_without_a_draft_class_are_refused_under_weights_gib(
    name: str, arch: str, release: str, command: str, family_dirs: dict[str, Path], cli: Callable[..., Any]
) -> None:
    """The draft's ModelConfig rewrites none of these architectures to a draft class in ``release``
    (configs/model_config.py's is_draft_model lines; Nemotron-H's NemotronHForCausalLMMTP from 0.5.8): the
    draft worker builds the target whole again. A figure given as a number does not make that green; the
    same deployment without speculative decoding is sized."""
    head = (
        ["derive", "--gpu-free-gib", "79"]
        if command == "derive"
        else ["plan", "--target-max-running-requests", "8", "--gpu-free-gib", "79"]
    )
    argv = [*head, "--weights-gib", "5", "--sglang-version", release, "--"]
    launch = ["--model-path", str(family_dirs[name]), "--tp-size", "1", "--mem-fraction-static", "0.85"]
    code, out, err = cli([*argv, *launch, "--speculative-algorithm", "NEXTN"])
    _one_line(code, out, err, "no NEXTN/MTP draft class for")
    assert f"builds {arch} whole" in err and "tp_worker.py:466-480" in err
    code, out, err = cli([*argv, *launch])
    assert code == 0, err


def test_nemotron_h_has_its_mtp_class_from_0_5_8(
    family_dirs: dict[str, Path], cli: Callable[..., Any]
) -> None:
    """From 0.5.8 the draft's ModelConfig makes Nemotron-H NemotronHForCausalLMMTP (0.5.8
    configs/model_config.py:310-311): not the target again. Its weights are not modelled: without a figure
    it is one line naming --weights-gib; a figure given with --weights-gib (target and draft) is sized."""
    launch = ["--model-path", str(family_dirs["nemotron_h_8b"]), "--tp-size", "1",
              "--mem-fraction-static", "0.85", "--speculative-algorithm", "NEXTN"]  # fmt: skip
    for release in ("0.5.8", "0.5.23"):
        code, out, err = cli(["derive", "--gpu-free-gib", "79", "--sglang-version", release, "--", *launch])
        _one_line(code, out, err, "no NEXTN/MTP draft class for Nemotron-H; give the weights per GPU")
        code, out, err = cli(["derive", "--gpu-free-gib", "79", "--weights-gib", "20", "--sglang-version",
                              release, "--", *launch])  # fmt: skip
        assert code == 0, err


def test_check_refuses_falcon_h1_under_nextn_with_weights_gib(family_dirs: dict[str, Path]) -> None:
    """check's rows as each node builds them: every rank's row is the one-line refusal, exit 2."""
    words = ["check", "--budget-from-device", "--device-free-gib", "79", "--weights-gib", "1",
             "--timeout-s", "20", "--backend", "gloo"]  # fmt: skip
    launch = ["--model-path", str(family_dirs["falcon_h1_0_5b"]), "--tp-size", "2",
              "--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"]  # fmt: skip
    rows = check_rows(words, launch, world_size=2)
    for row in rows:
        assert "no NEXTN/MTP draft class for Falcon-H1" in row.error and "\n" not in row.error, row.error
    assert decide(rows, world_size=2).exit_code == 2
