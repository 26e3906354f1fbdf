"""The speculative draft's weights (issue 39 item 3): the NEXTN/MTP layer in the target checkpoint, on the
ranks that load it, in the budget where the release charges it.

The draft class's bytes are held to SGLang's own ``Qwen3NextForCausalLMMTP`` on the meta device in
tests/test_weights.py (case ``qwen3_next/mtp-draft``, 0.5.15 / 0.5.20 / 0.5.23); here: which rank carries
them, from which release, and what a user sees (derive's JSON, the one-line refusals). Model directories
hold sparse checkpoints of the real shapes (tests/checkpoints.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import CheckerInputError, FlagError
from checker.core.weights.weights import GIB, WeightsLayout, allocator_bytes
from checker.families.drafts import separate_draft_rank_params, with_separate_draft
from checker.families.rules import draft_rank_params, model_weights
from tests.checkpoints import model_dir, mtp_tensors

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3_NEXT = FIXTURES / "qwen3_next_80b_a3b.json"
CONFIG = json.loads(QWEN3_NEXT.read_text())
EAGLE3_CONFIG = json.loads((FIXTURES / "weights/eagle3_qwen3_next_draft.json").read_text())


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # as the published checkpoint: the target's tensors and the MTP layer's mtp.*
    return model_dir(
        tmp_path_factory.mktemp("qn") / "Qwen3-Next-80B-A3B", QWEN3_NEXT, shards=4, extra=mtp_tensors(CONFIG)
    )


def _draft_held(layout: WeightsLayout, release: str) -> dict[int, int]:
    return {
        p.rank: allocator_bytes([x.nbytes for x in params])
        for p, params in draft_rank_params(CONFIG, layout, release=release)
    }


def test_under_pp_only_the_last_stage_builds_the_draft() -> None:
    """The placement rule (0.5.23 scheduler.py:1042-1051): pp 2 x tp 2, ranks 2 and 3 build the whole
    draft class, ranks 0 and 1 none. Qwen3-Next's own class asserts one stage (qwen3_next.py:1036), so
    a deployment reaches this only at pp 1; the rule is the draft's, not the family's."""
    held = _draft_held(WeightsLayout(pp_size=2, tp_size=2, draft="nextn"), "0.5.23")
    assert sorted(held) == [2, 3] and held[2] == held[3]
    # built as one stage: the same bytes as every rank of pp 1 x tp 2 (its own embedding, layer, head)
    assert held[2] == _draft_held(WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), "0.5.23")[0] > 2 * GIB


def test_the_draft_is_its_own_part_of_the_figure() -> None:
    plain = WeightsLayout(pp_size=1, tp_size=2)
    without = model_weights(CONFIG, plain, release="0.5.23").ranks
    with_draft = model_weights(CONFIG, dataclasses.replace(plain, draft="nextn"), release="0.5.23").ranks
    held = _draft_held(dataclasses.replace(plain, draft="nextn"), "0.5.23")
    for a, b in zip(without, with_draft, strict=True):
        assert b.draft_bytes == held[b.place.rank]
        assert (a.param_bytes, a.margin_bytes) == (b.param_bytes, b.margin_bytes)
        assert b.total_bytes == a.total_bytes + b.draft_bytes


def test_at_pp_1_every_rank_loads_the_draft_split_by_tp() -> None:
    layout = WeightsLayout(pp_size=1, tp_size=4, draft="nextn")
    ranks = model_weights(CONFIG, layout, release="0.5.23").ranks
    assert len({r.draft_bytes for r in ranks}) == 1 and ranks[0].draft_bytes > 0
    tp1 = model_weights(CONFIG, dataclasses.replace(layout, tp_size=1), release="0.5.23").ranks[0]
    assert 3 * ranks[0].draft_bytes < tp1.draft_bytes < 5 * ranks[0].draft_bytes


@pytest.mark.parametrize("release, charged", [("0.5.13", False), ("0.5.14", True), ("0.5.23", True)])
def test_the_draft_is_charged_from_the_release_that_loads_it_before_the_pool(
    release: str, charged: bool
) -> None:
    """Up to 0.5.13.post1 the target sizes its pool before the draft worker exists (the draft comes out
    of the slack); from 0.5.14 the scheduler loads the draft first (scheduler.py init_model_worker)."""
    layout = WeightsLayout(pp_size=1, tp_size=2, draft="nextn")
    ranks = model_weights(CONFIG, layout, release=release).ranks
    assert all((r.draft_bytes > 0) == charged for r in ranks)


def test_a_quantized_target_with_a_draft_is_refused_in_one_line() -> None:
    cfg = dict(
        CONFIG,
        quantization_config={
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    )
    with pytest.raises(FlagError) as exc:
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=1, draft="nextn"), release="0.5.23")
    assert "draft" in str(exc.value) and "--weights-gib" in str(exc.value) and "\n" not in str(exc.value)


def test_a_family_without_a_modelled_draft_class_is_refused_in_one_line() -> None:
    cfg = json.loads((FIXTURES / "kimi_linear_48b_a3b.json").read_text())
    with pytest.raises(FlagError) as exc:
        model_weights(cfg, WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), release="0.5.23")
    assert "no NEXTN/MTP draft class" in str(exc.value)


DERIVE = ["derive", "--gpu-free-gib", "139", "--format", "json", "--sglang-version", "0.5.23", "--"]


def test_derive_shows_the_draft_as_its_own_part_and_takes_it_off_the_budget(
    qwen_dir: Path, cli: Callable[..., Any]
) -> None:
    """tp 2 with EAGLE on 0.5.23: every rank's figure carries the draft, its own field in the JSON; the
    budget is sized from the busiest rank's figure with it."""
    base = ["--model-path", str(qwen_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    env: dict[str, str] = {}
    code, out, err = cli([*DERIVE, *base], env=env)
    assert code == 0, err
    plain = json.loads(out)["weights"]["per_rank"]
    code, out, err = cli([*DERIVE, *base, "--speculative-algorithm", "EAGLE"], env=env)
    assert code == 0, err
    doc = json.loads(out)
    spec = doc["weights"]["per_rank"]
    held = _draft_held(WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), "0.5.23")
    assert [r["draft_bytes"] for r in spec] == [held[0], held[1]]
    for a, b in zip(plain, spec, strict=True):
        assert b["weights_bytes"] == a["weights_bytes"] + b["draft_bytes"]
        assert b["param_bytes"] + b["margin_bytes"] + b["draft_bytes"] == b["weights_bytes"]
    busiest = max(r["weights_bytes"] for r in spec) / GIB
    assert doc["inputs"]["budget_gib"] == pytest.approx(139 - busiest - 139 * 0.15, abs=1e-3)


def test_a_draft_path_that_is_no_model_directory_is_one_line_and_exit_2(
    qwen_dir: Path, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    argv = [*DERIVE, "--model-path", str(qwen_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    missing = tmp_path / "no-draft"
    code, out, err = cli(
        [*argv, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(missing)]
    )
    assert code == 2 and "not a model directory" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # a model directory of an architecture the checker does not model (Mistral's EAGLE class; the Llama
    # and Qwen2 EAGLE-2 ones are modelled: tests/test_eagle2_draft.py): refused naming it (never sized
    # without the draft)
    other = tmp_path / "mistral-eagle"
    other.mkdir()
    (other / "config.json").write_text(
        json.dumps(dict(EAGLE3_CONFIG, architectures=["MistralForCausalLMEagle"], num_hidden_layers=1))
    )
    code, out, err = cli(
        [*argv, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(other)]
    )
    assert code == 2 and "(MistralForCausalLMEagle)" in err and "--weights-gib" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # the target's own directory named as the draft: its NEXTN/MTP layer
    code, out, err = cli(
        [*argv, "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", str(qwen_dir)]
    )
    assert code == 0, err
    assert all(r["draft_bytes"] > 0 for r in json.loads(out)["weights"]["per_rank"])


# ---- Qwen3.5's MTP draft (Qwen3_5ForCausalLMMTP) -------------------------------------------------------

QWEN3_5 = FIXTURES / "weights/qwen3_5_397b_a17b.json"
CONFIG_3_5 = json.loads(QWEN3_5.read_text())


def test_qwen3_5_under_pp_only_the_last_stage_carries_its_mtp_draft() -> None:
    """Qwen3.5 runs under PP (unlike Qwen3-Next's class), so the placement rule is reached: pp 2 x tp 4
    on 0.5.23, the last stage's four ranks load the whole one-stage draft (its own embedding, layer, norm
    and head, split by the target's TP), the first stage's none."""
    layout = WeightsLayout(pp_size=2, tp_size=4, draft="nextn")
    ranks = model_weights(CONFIG_3_5, layout, release="0.5.23").ranks
    plain = model_weights(CONFIG_3_5, dataclasses.replace(layout, draft=None), release="0.5.23").ranks
    one_stage = {
        p.rank: allocator_bytes([x.nbytes for x in params])
        for p, params in draft_rank_params(CONFIG_3_5, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    }
    assert [r.draft_bytes for r in ranks[:4]] == [0, 0, 0, 0]
    assert [r.draft_bytes for r in ranks[4:]] == [one_stage[k] for k in range(4)]
    assert ranks[4].draft_bytes > 3 * GIB  # embedding + head of a 248k vocabulary, 512 experts of one layer
    for a, b in zip(plain, ranks, strict=True):
        assert b.total_bytes == a.total_bytes + b.draft_bytes


def test_qwen3_5_draft_reads_the_text_configs_tie_not_the_top_levels() -> None:
    """``tie_word_embeddings`` true at the top level only (qwen3_5_mtp.py:139-141 reads the text config):
    the draft keeps its own lm_head, while the target ties it (held to SGLang's classes in
    expected.json: qwen3_5/mtp-draft-tied, qwen3_5/tied)."""
    tied = json.loads((FIXTURES / "weights/qwen3_5_moe_tied.json").read_text())
    one = WeightsLayout(pp_size=1, tp_size=1)
    ((_, draft),) = draft_rank_params(tied, one, release="0.5.23")
    assert "lm_head.weight" in {p.name for p in draft}
    text_tied = dict(tied, text_config=dict(tied["text_config"], tie_word_embeddings=True))
    ((_, draft_tied),) = draft_rank_params(text_tied, one, release="0.5.23")
    assert "lm_head.weight" not in {p.name for p in draft_tied}
    vocab, hidden = tied["text_config"]["vocab_size"], tied["text_config"]["hidden_size"]
    assert sum(p.nbytes for p in draft) - sum(p.nbytes for p in draft_tied) == vocab * hidden * 2


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(
        tmp_path_factory.mktemp("q35") / "Qwen3.5-397B-A17B", QWEN3_5, shards=4, extra=mtp_tensors(CONFIG_3_5)
    )


def test_derive_under_pp_charges_the_qwen3_5_draft_to_the_last_stage(
    qwen3_5_dir: Path, cli: Callable[..., Any]
) -> None:
    """pp 2 x tp 4, EAGLE with SGLANG_ENABLE_PP_SPEC on 0.5.23: the last stage's ranks carry the draft
    in derive's JSON, the first stage's do not, and the budget is sized from the busiest (a last) rank."""
    argv = [*DERIVE, "--model-path", str(qwen3_5_dir), "--tp-size", "4", "--pp-size", "2"]
    argv += ["--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"]
    code, out, err = cli(argv, env={"SGLANG_ENABLE_PP_SPEC": "1"})
    assert code == 0, err
    doc = json.loads(out)
    per_rank = doc["weights"]["per_rank"]
    one_stage = {
        p.rank: allocator_bytes([x.nbytes for x in params])
        for p, params in draft_rank_params(CONFIG_3_5, WeightsLayout(pp_size=1, tp_size=4), release="0.5.23")
    }
    assert [r["draft_bytes"] for r in per_rank] == [0] * 4 + [one_stage[k] for k in range(4)]
    busiest = max(r["weights_bytes"] for r in per_rank)
    assert busiest == per_rank[7]["weights_bytes"] > per_rank[3]["weights_bytes"] + one_stage[3] // 2
    assert doc["inputs"]["budget_gib"] == pytest.approx(139 - busiest / GIB - 139 * 0.15, abs=1e-3)


# ---- a separate draft directory (--speculative-draft-model-path) ---------------------------------------


def _draft_dir(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _separate_held(config: dict[str, Any], layout: WeightsLayout, release: str) -> dict[int, int]:
    return {
        p.rank: allocator_bytes([x.nbytes for x in params])
        for p, params in separate_draft_rank_params(config, layout, release=release)
    }


def test_derive_charges_a_separate_eagle3_draft_on_every_rank(
    qwen_dir: Path, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """Qwen3-Next at tp 2 with an EAGLE3 draft directory (config.json only: the class decides the bytes,
    LlamaForCausalLMEagle3 held to SGLang's own on 7 releases in expected.json): each rank carries the
    draft split by the target's TP (its SINGLE_GROUP layout is the target's attention TP without DP)."""
    draft = _draft_dir(tmp_path / "eagle3", EAGLE3_CONFIG)
    base = ["--model-path", str(qwen_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    code, out, err = cli([*DERIVE, *base])
    assert code == 0, err
    plain = json.loads(out)["weights"]["per_rank"]
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft)]
    code, out, err = cli([*DERIVE, *base, *spec])
    assert code == 0, err
    per_rank = json.loads(out)["weights"]["per_rank"]
    held = _separate_held(EAGLE3_CONFIG, WeightsLayout(pp_size=1, tp_size=2), "0.5.23")
    assert [r["draft_bytes"] for r in per_rank] == [held[0], held[1]]
    assert 0.5 * GIB < held[0] < 1 * GIB  # 76k x 2048 embedding, one layer, a 32k head, a 262k RoPE cache
    for a, b in zip(plain, per_rank, strict=True):
        assert b["weights_bytes"] == a["weights_bytes"] + b["draft_bytes"]


def test_a_separate_directory_of_the_family_is_its_mtp_draft_on_the_last_stage(
    qwen3_5_dir: Path, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """A Qwen3.5 directory (config.json only) given as the draft: the draft ModelConfig rewrites its
    architecture to Qwen3_5ForCausalLMMTP (model_config.py:1159-1181), so it is sized as the MTP class of
    that config, on the last stage only under PP."""
    draft = _draft_dir(tmp_path / "mtp", CONFIG_3_5)
    argv = [*DERIVE, "--model-path", str(qwen3_5_dir), "--tp-size", "4", "--pp-size", "2"]
    argv += ["--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"]
    code, out, err = cli(
        [*argv, "--speculative-draft-model-path", str(draft)], env={"SGLANG_ENABLE_PP_SPEC": "1"}
    )
    assert code == 0, err
    separate = [r["draft_bytes"] for r in json.loads(out)["weights"]["per_rank"]]
    code, out, err = cli(argv, env={"SGLANG_ENABLE_PP_SPEC": "1"})
    assert code == 0, err
    assert separate == [r["draft_bytes"] for r in json.loads(out)["weights"]["per_rank"]]
    assert separate[:4] == [0] * 4 and min(separate[4:]) > 0


def test_a_separate_draft_beside_a_quantized_target_is_sized() -> None:
    """The draft is its own checkpoint: a quantized target (FP8) does not make it quantized, so unlike
    the target's own NEXTN layer it is sized (bf16, from its own config.json)."""
    fp8 = json.loads((FIXTURES / "weights/qwen3_next_fp8_block.json").read_text())
    layout = WeightsLayout(pp_size=1, tp_size=2, draft="separate", draft_path="unused")
    plain = model_weights(fp8, dataclasses.replace(layout, draft=None), release="0.5.23")
    mw = with_separate_draft(plain, EAGLE3_CONFIG, layout, release="0.5.23", source="draft/config.json")
    held = _separate_held(EAGLE3_CONFIG, layout, "0.5.23")
    assert [r.draft_bytes for r in mw.ranks] == [held[0], held[1]]
    assert [r.total_bytes - r.draft_bytes for r in mw.ranks] == [r.total_bytes for r in plain.ranks]


def test_a_separate_draft_is_charged_from_0_5_14() -> None:
    layout = WeightsLayout(pp_size=1, tp_size=2, draft="separate", draft_path="unused")
    for release, charged in (("0.5.13", False), ("0.5.14", True)):
        plain = model_weights(CONFIG, dataclasses.replace(layout, draft=None), release=release)
        mw = with_separate_draft(plain, EAGLE3_CONFIG, layout, release=release, source="d")
        assert all((r.draft_bytes > 0) == charged for r in mw.ranks)


@pytest.mark.parametrize(
    "change, layout, words",
    [
        ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, {}, "quantized"),
        ({}, {"dp_size": 2}, "attention DP"),
        ({"architectures": ["DeepseekV3ForCausalLMNextN"]}, {}, "(DeepseekV3ForCausalLMNextN)"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, {}, "rope_scaling type 'yarn'"),
    ],
)
def test_a_separate_draft_the_checker_does_not_model_is_refused_in_one_line(
    change: dict[str, Any], layout: dict[str, int], words: str
) -> None:
    config = dict(EAGLE3_CONFIG, **change)
    with pytest.raises(CheckerInputError) as exc:
        separate_draft_rank_params(config, WeightsLayout(pp_size=1, tp_size=2, **layout), release="0.5.23")
    assert words in str(exc.value) and "--weights-gib" in str(exc.value) and "\n" not in str(exc.value)


# ---- the draft in the text output -----------------------------------------------------------------------


def test_check_text_shows_each_ranks_draft_as_its_own_part(qwen_dir: Path) -> None:
    """check in-process, as each node builds its row (parser, launch-command merge, derive_row, the wire's
    round trip, decide): at tp 2 with EAGLE each rank's row carries its draft, and the text report and
    step summary name it beside the rank's weights figure."""
    from checker.outputs.report import to_markdown, to_text
    from checker.preflight.verdict import decide
    from tests.test_weights_commands import FAST, check_rows

    words = ["check", "--budget-from-device", "--device-free-gib", "139", *FAST]
    launch = ["--model-path", str(qwen_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    launch += ["--speculative-algorithm", "EAGLE"]
    rows = check_rows(words, launch, world_size=2)
    held = _draft_held(WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), "0.5.23")
    assert [r.draft_bytes for r in rows] == [held[0], held[1]]
    verdict = decide(rows, world_size=2)
    for text in (to_text(verdict, summary="", elapsed_s=1.0), to_markdown(verdict, summary="")):
        for r in rows:
            assert (
                f"{r.weights_bytes / GIB:.2f} GiB (checkpoint, draft {r.draft_bytes / GIB:.2f} GiB from "
                "target-mtp)" in text
            )


def test_derive_text_names_the_draft_in_the_budget_line(qwen_dir: Path, cli: Callable[..., Any]) -> None:
    base = ["--model-path", str(qwen_dir), "--tp-size", "2", "--mem-fraction-static", "0.85"]
    argv = ["derive", "--gpu-free-gib", "139", "--sglang-version", "0.5.23", "--", *base]
    code, out, err = cli([*argv, "--speculative-algorithm", "EAGLE"])
    assert code == 0, err
    held = _draft_held(WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), "0.5.23")
    assert f"busiest rank 0, of which the speculative draft {held[0] / GIB:.2f} GiB from target-mtp)" in out
    code, out, err = cli(argv)
    assert code == 0, err
    assert "speculative draft" not in out


def test_plan_text_names_the_draft_in_the_weights_line(qwen_dir: Path, cli: Callable[..., Any]) -> None:
    argv = [
        "plan",
        "--target-max-running-requests",
        "48",
        "--gpu-free-gib",
        "139",
        "--sglang-version",
        "0.5.23",
    ]
    argv += ["--", "--model-path", str(qwen_dir), "--tp-size", "2", "--speculative-algorithm", "EAGLE"]
    code, out, err = cli(argv)
    assert code == 0, err
    held = _draft_held(WeightsLayout(pp_size=1, tp_size=2, draft="nextn"), "0.5.23")
    assert f"+ speculative draft {held[0] / GIB:.2f} from target-mtp; --weights-gib overrides)" in out
