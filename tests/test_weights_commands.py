"""The checkpoint's weights figure where a user reads it: check's budget and report, plan's fraction,
derive's server budget.

Model directories hold a sparse checkpoint of the real shapes (tests/checkpoints.py: real headers, no
data). The figures are held to :func:`checker.core.weights.weights.model_weights` (itself held to SGLang's own
classes in tests/test_weights.py) and to the release's budget formula worked by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import run_world

from checker.core.sizing.planning import min_mem_fraction
from checker.core.weights.weights import GIB, WeightsLayout
from checker.distributed.launch_env import RankEnv
from checker.distributed.wire import decode_row, encode_row
from checker.families.rules import model_weights
from checker.outputs.report import to_json, to_markdown, to_text
from checker.preflight import derivation
from checker.preflight.verdict import decide
from tests.checkpoints import header_bytes, model_dir, write_shard

FIXTURES = Path(__file__).parent / "fixtures"
KIMI = FIXTURES / "kimi_linear_48b_a3b.json"
QWEN3_NEXT = FIXTURES / "qwen3_next_80b_a3b.json"
FAST = ["--timeout-s", "20", "--backend", "gloo"]


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("kimi") / "Kimi-Linear-48B-A3B", KIMI, shards=6)


def _figures(config: Path, layout: WeightsLayout) -> list[float]:
    mw = model_weights(json.loads(config.read_text()), layout, release="0.5.23")
    return [r.total_bytes / GIB for r in mw.ranks]


def _env(rank: int, world_size: int) -> RankEnv:
    return RankEnv(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        node_rank=0,
        host="node-0",
        master_addr=None,
        master_port=None,
        use_agent_store=False,
        restart_count=0,
        max_restarts=0,
    )


def check_rows(words: list[str], launch: list[str], *, world_size: int) -> list[Any]:
    """Each rank's row as its node builds it, in-process: the real parser, the launch-command merge,
    derive_row and the wire's round trip."""
    from checker.cli.main import _subparser, build_parser, join_negative_values, with_default_command
    from checker.cli.namespace import apply_launch_command, given_dests
    from checker.commands.check_config import config_from_args

    rows = []
    for rank in range(world_size):
        argv = join_negative_values(with_default_command(list(words)))
        parser = build_parser()
        args = parser.parse_args(argv)
        args.given = given_dests(_subparser(parser, "check"), argv[1:])
        args, args.launch = apply_launch_command(args, launch, given=args.given)
        env = _env(rank, world_size)
        config = config_from_args(args, env)
        facts = derivation.local_facts(config, env, None)
        row = derivation.derive_row(
            config,
            env,
            facts,
            all_free=[facts.device_free_bytes] * world_size,
            torch_version="2.8.0",
            device=None,
            environ={},
        )
        rows.append(decode_row(encode_row(row)))
    return rows


def test_each_rank_row_carries_its_checkpoint_figure(kimi_dir: Path) -> None:
    """In-process, as each node builds its row (the real parser, the launch-command merge, derive_row, the
    wire's round trip, decide): at pp 2 each rank's row carries its own checkpoint figure and source, the
    budget takes the busiest rank's figure off the agreed free memory (SGLang's MIN over ranks), and the
    JSON and text reports show both."""
    words = ["check", "--budget-from-device", "--device-free-gib", "139", *FAST]
    launch = ["--model-path", str(kimi_dir), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    rows = check_rows(words, launch, world_size=2)
    verdict = decide(rows, world_size=2)
    want = _figures(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    doc = to_json(verdict, extra={})
    ranks = doc["ranks"]
    assert isinstance(ranks, list)
    assert [r["weights_bytes"] / GIB for r in ranks] == pytest.approx(want, abs=1e-6)
    assert [r["weights_source"] for r in ranks] == ["checkpoint", "checkpoint"]
    budget = 139 - max(want) - 139 * 0.15
    assert [r["budget_gib"] for r in ranks] == pytest.approx([budget] * 2, abs=1e-3)
    text = to_text(verdict, summary="", elapsed_s=1.0)
    assert f"{want[0]:.2f} GiB (checkpoint)" in text and f"{want[1]:.2f} GiB (checkpoint)" in text
    summary = to_markdown(verdict, summary="")  # the step summary
    assert f"{want[0]:.2f} GiB (checkpoint)" in summary and f"{want[1]:.2f} GiB (checkpoint)" in summary


@pytest.mark.slow
def test_check_takes_each_rank_weights_from_the_checkpoint(kimi_dir: Path, tmp_path: Path) -> None:
    """Two ranks at pp 2: each rank's report carries its own figure and source; the budget takes the
    busiest rank's figure off the agreed free memory, as SGLang's MIN over ranks does."""
    argv = ["check", "--budget-from-device", "--device-free-gib", "139", *FAST]
    argv += ["--", "--model-path", str(kimi_dir), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [0, 0], res.ranks[0].stderr[-2000:]
    rep = res.report()
    want = _figures(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    got = [r["weights_bytes"] / GIB for r in rep["ranks"]]
    assert got == pytest.approx(want, abs=1e-6)
    assert [r["weights_source"] for r in rep["ranks"]] == ["checkpoint", "checkpoint"]
    assert rep["weights_gib"] == pytest.approx(want, abs=1e-5) and "checkpoint" in rep["weights_source"]
    budget = 139 - max(want) - 139 * 0.15
    assert [r["budget_gib"] for r in rep["ranks"]] == pytest.approx([budget] * 2, abs=1e-3)
    text = res.ranks[0].stdout
    assert "weights" in text and f"{want[1]:.2f} GiB (checkpoint)" in text


@pytest.mark.slow
def test_weights_gib_overrides_the_checkpoint(kimi_dir: Path, tmp_path: Path) -> None:
    argv = ["check", "--budget-from-device", "--device-free-gib", "139", "--weights-gib", "30", *FAST]
    argv += ["--", "--model-path", str(kimi_dir), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [0, 0], res.ranks[0].stderr[-2000:]
    rep = res.report()
    assert [r["weights_source"] for r in rep["ranks"]] == ["flag", "flag"]
    assert [r["weights_bytes"] for r in rep["ranks"]] == [30 * GIB, 30 * GIB]


@pytest.mark.slow
def test_a_truncated_shard_is_one_line_and_exit_2_on_every_rank(kimi_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    for p in kimi_dir.iterdir():
        (d / p.name).symlink_to(p)
    shard = sorted(d.glob("*.safetensors"))[0]
    tensors = [("w", (1024, 64), "BF16")]
    shard.unlink()
    _, data = header_bytes(tensors)
    write_shard(shard, tensors, data_bytes=data // 2)
    argv = ["check", "--budget-from-device", "--device-free-gib", "139", *FAST]
    argv += ["--", "--model-path", str(d), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [2, 2]
    rep = res.report()
    assert rep["status"] == "error"
    line = rep["ranks"][0]["error"]
    assert "truncated" in line and shard.name in line and "\n" not in line


def test_the_launch_command_ep_size_changes_each_rank_figure(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """--ep-size in the launch command: every EP rank holds a quarter of the experts (and Qwen3-Next's
    fused shared expert), so the figure plan assumes falls with it."""
    d = model_dir(tmp_path / "Qwen3-Next-80B-A3B", QWEN3_NEXT, shards=4)
    base = ["plan", "--target-max-running-requests", "8", "--gpu-free-gib", "139", "--format", "json"]
    gib = {}
    for ep in ("1", "4"):
        code, out, err = cli([*base, "--", "--model-path", str(d), "--tp-size", "4", "--ep-size", ep])
        assert code == 0, err
        doc = json.loads(out)
        assert doc["weights"]["source"] == "checkpoint"
        gib[ep] = doc["weights"]["gib"]
    want = {
        ep: max(_figures(QWEN3_NEXT, WeightsLayout(pp_size=1, tp_size=4, ep_size=int(ep))))
        for ep in ("1", "4")
    }
    assert gib == pytest.approx(want, abs=1e-6)
    assert gib["4"] != gib["1"]


def test_plan_states_the_weights_it_assumed(kimi_dir: Path, cli: Callable[..., Any]) -> None:
    argv = ["plan", "--target-max-running-requests", "48", "--gpu-free-gib", "139"]
    code, out, err = cli([*argv, "--", "--model-path", str(kimi_dir), "--pp-size", "3"])
    assert code == 0, err
    want = _figures(KIMI, WeightsLayout(pp_size=3, tp_size=1))
    busiest = max(range(3), key=lambda r: want[r])
    assert f"before {max(want):g} GiB of weights" in out
    assert f"on the busiest rank, rank {busiest} (from the checkpoint" in out


def test_plan_over_two_releases_assumes_each_release_s_weights(
    kimi_dir: Path, cli: Callable[..., Any]
) -> None:
    """--sglang-version A,B with --gpu-free-gib and no --weights-gib: each release's fraction is worked
    from the busiest rank of the checkpoint as that release's class holds it (the weights were once
    asked of the two releases' config as if it were one release: 'A,B is not a release number')."""
    releases = ("0.5.22", "0.5.23")
    argv = ["plan", "--target-max-running-requests", "48", "--gpu-free-gib", "139", "--format", "json"]
    argv += ["--sglang-version", ",".join(releases), "--model-config", str(kimi_dir), "--pp-size", "3"]
    code, out, err = cli(argv)
    assert code == 0, err
    doc = json.loads(out)
    config = json.loads(KIMI.read_text())
    for v in releases:
        side = doc["by_release"][v]
        mw = model_weights(config, WeightsLayout(pp_size=3, tp_size=1), release=v)
        weights = max(r.total_bytes for r in mw.ranks) / GIB
        want = min_mem_fraction(
            v, free_before_gib=139, weights_gib=weights, budget_gib=side["min_budget_gib"]
        )
        assert want.value is not None
        assert side["mem_fraction_static"]["value"] == pytest.approx(want.value), v


def test_derive_answers_what_a_fraction_gives(kimi_dir: Path, cli: Callable[..., Any]) -> None:
    """derive --gpu-free-gib with the launch command's --mem-fraction-static: the budget is the release's
    formula with the busiest rank's figure from the checkpoint."""
    argv = ["derive", "--gpu-free-gib", "79", "--format", "json", "--"]
    code, out, err = cli(
        [*argv, "--model-path", str(kimi_dir), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    )
    assert code == 0, err
    doc = json.loads(out)
    weights = max(_figures(KIMI, WeightsLayout(pp_size=2, tp_size=1)))
    assert doc["inputs"]["budget_gib"] == pytest.approx(79 - weights - 79 * 0.15, abs=1e-3)
    assert "the checkpoint" in doc["inputs"]["budget_source"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--gpu-free-gib", "79"], "needs the server's --mem-fraction-static"),
        (["--weights-gib", "8"], "--weights-gib applies with --gpu-free-gib"),
        (["--gpu-free-gib", "79", "--budget-gib", "8", "--mem-fraction-static", "0.9"], "two budget sources"),
    ],
)
def test_derive_refuses_a_half_given_fraction_question(
    argv: list[str], words: str, cli: Callable[..., Any]
) -> None:
    code, _, err = cli(["derive", *argv])
    assert code == 2 and words in err and err.count("\n") <= 1


def _snapshot(cache: Path, repo: str, source: Path, revision: str = "main") -> Path:
    """A hub cache as ``hf download`` leaves it: refs/<revision> naming a snapshot holding ``source``'s
    files."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    for p in source.iterdir():
        (snap / p.name).symlink_to(p)
    (folder / "refs").mkdir()
    (folder / "refs" / revision).write_text(commit)
    return snap


def test_a_hub_id_weights_come_from_the_download_dir(
    kimi_dir: Path, tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id with the launch command's --download-dir: config.json from the hub cache (as SGLang's
    config reader finds it), the weights from that directory's snapshot (SGLang's loader downloads there:
    ``snapshot_download(cache_dir=download_dir)``); where the directory lacks it, config.json's figure."""
    repo = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").symlink_to(kimi_dir / "config.json")
    for name in ("HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "TRANSFORMERS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _snapshot(tmp_path / "hub", repo, config_only, revision="v1")
    _snapshot(tmp_path / "weights", repo, kimi_dir, revision="v1")
    argv = ["plan", "--target-max-running-requests", "48", "--gpu-free-gib", "139", "--format", "json"]
    launch = ["--", "--model-path", repo, "--revision", "v1", "--pp-size", "3"]
    code, out, err = cli([*argv, *launch, "--download-dir", str(tmp_path / "weights")])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["weights"]["source"] == "checkpoint"
    assert doc["weights"]["gib"] == pytest.approx(max(_figures(KIMI, WeightsLayout(pp_size=3, tp_size=1))))
    # not downloaded there yet: SGLang would fetch it at start-up, so there is no figure to assume
    code, out, err = cli([*argv, *launch, "--download-dir", str(tmp_path / "empty")])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        f"--download-dir {tmp_path / 'empty'} holds no snapshot of {repo}" in err and "--weights-gib" in err
    )
    # without --download-dir the weights are beside config.json in the hub cache: none there, and the
    # figure is config.json's by the release's class, the same bytes the checkpoint gives
    code, out, err = cli([*argv, *launch])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["weights"]["source"] == "config"
    assert doc["weights"]["gib"] == pytest.approx(max(_figures(KIMI, WeightsLayout(pp_size=3, tp_size=1))))


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (["--model", "kimi-k3"], "kimi-k3 is a preset, not a model directory"),
        (["--model-config", str(KIMI)], "is a model spec, not a model directory"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "derive"])
def test_the_fraction_question_without_a_checkpoint_names_why(
    command: str, model: list[str], why: str, cli: Callable[..., Any]
) -> None:
    """--gpu-free-gib with neither --weights-gib nor a checkpoint: one line, exit 2, saying why there is no
    checkpoint and naming --weights-gib."""
    argv = [command, *model, "--gpu-free-gib", "139", "--pp-size", "2"]
    argv += ["--target-max-running-requests", "8"] if command == "plan" else ["--mem-fraction-static", "0.85"]
    code, out, err = cli(argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert why in err and "--weights-gib" in err


def _parts(config: Path, layout: WeightsLayout) -> list[tuple[int, int, int, int]]:
    """Every rank's (param, buffer, margin, total) bytes as the release's class holds them."""
    mw = model_weights(json.loads(config.read_text()), layout, release="0.5.23")
    return [(r.param_bytes, r.buffer_bytes, r.margin_bytes, r.total_bytes) for r in mw.ranks]


def test_check_reports_each_rank_weights_and_fraction_as_integers(
    kimi_dir: Path, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    """Two ranks on a real gloo group, the fraction left to the release: each rank's report entry carries
    its checkpoint figure's parts as integers (they crossed the wire, schema 13) and the fraction the
    budget used, with its source, as fields of their own (not only inside budget_source)."""
    argv = ["check", "--budget-from-device", "--device-free-gib", "79", "--device-total-gib", "79.65", *FAST]
    argv += ["--", "--model-path", str(kimi_dir), "--pp-size", "2"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [0, 0], res.ranks[0].stderr[-2000:]
    ranks = res.report()["ranks"]
    want = _parts(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    got = [(r["param_bytes"], r["buffer_bytes"], r["margin_bytes"], r["weights_bytes"]) for r in ranks]
    assert got == want and all(isinstance(x, int) for row in got for x in row)
    assert all(p + m == t for p, _, m, t in got)
    assert [r["mem_fraction_source"] for r in ranks] == ["release default"] * 2
    fractions = {r["mem_fraction_static"] for r in ranks}
    assert len(fractions) == 1 and 0.5 < min(fractions) < 0.95
    # the one derive picks for the same deployment (budget_source, cut at the wire's width, lost it)
    code, out, err = cli(
        ["derive", "--gpu-free-gib", "79", "--device-total-gib", "79.65", "--format", "json", "--"]
        + ["--model-path", str(kimi_dir), "--pp-size", "2"]
    )
    assert code == 0, err
    assert fractions == {json.loads(out)["weights"]["mem_fraction_static"]}


def test_check_names_a_given_fraction_and_a_flag_figure(kimi_dir: Path, tmp_path: Path) -> None:
    """--weights-gib: a number, so no parts (null); the launch command's fraction is ``given``."""
    argv = ["check", "--budget-from-device", "--device-free-gib", "139", "--weights-gib", "30", *FAST]
    argv += ["--", "--model-path", str(kimi_dir), "--pp-size", "2", "--mem-fraction-static", "0.85"]
    res = run_world(argv, world_size=2, tmp_path=tmp_path)
    assert res.codes == [0, 0], res.ranks[0].stderr[-2000:]
    ranks = res.report()["ranks"]
    assert [(r["param_bytes"], r["margin_bytes"], r["weights_bytes"]) for r in ranks] == [
        (None, None, 30 * GIB)
    ] * 2
    assert [(r["mem_fraction_static"], r["mem_fraction_source"]) for r in ranks] == [(0.85, "given")] * 2


@pytest.mark.parametrize("fraction", [["--mem-fraction-static", "0.85"], []])
def test_derive_json_carries_each_rank_weights(
    fraction: list[str], kimi_dir: Path, cli: Callable[..., Any]
) -> None:
    """derive --gpu-free-gib --format json: every rank's figure as integers (the busiest is the one the
    budget used) and the fraction with its source: given, or the release's default for the GPU total."""
    argv = ["derive", "--gpu-free-gib", "79", "--device-total-gib", "79.65", "--format", "json", "--"]
    code, out, err = cli([*argv, "--model-path", str(kimi_dir), "--pp-size", "2", *fraction])
    assert code == 0, err
    w = json.loads(out)["weights"]
    want = _parts(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    got = [
        (r["param_bytes"], r["buffer_bytes"], r["margin_bytes"], r["weights_bytes"]) for r in w["per_rank"]
    ]
    assert got == want and [r["weights_source"] for r in w["per_rank"]] == ["checkpoint"] * 2
    budget_source = json.loads(out)["inputs"]["budget_source"]
    assert f"{max(t for *_, t in want) / GIB:.2f} GiB" in budget_source
    if fraction:
        assert (w["mem_fraction_static"], w["mem_fraction_source"]) == (0.85, "given")
    else:
        assert w["mem_fraction_source"] == "release default"
        assert f"--mem-fraction-static {w['mem_fraction_static']:g}, SGLang 0.5.23's default" in budget_source


def test_derive_json_has_no_weights_without_the_server_budget(cli: Callable[..., Any]) -> None:
    code, out, err = cli(
        ["derive", "--model", "kimi-k3", "--pp-size", "2", "--budget-gib", "8", "--format", "json"]
    )
    assert code == 0, err
    assert json.loads(out)["weights"] is None


def test_plan_json_carries_each_rank_weights(kimi_dir: Path, cli: Callable[..., Any]) -> None:
    argv = ["plan", "--target-max-running-requests", "8", "--gpu-free-gib", "139", "--format", "json"]
    code, out, err = cli([*argv, "--", "--model-path", str(kimi_dir), "--pp-size", "2"])
    assert code == 0, err
    per_rank = json.loads(out)["weights"]["per_rank"]
    want = _parts(KIMI, WeightsLayout(pp_size=2, tp_size=1))
    assert [
        (r["param_bytes"], r["buffer_bytes"], r["margin_bytes"], r["weights_bytes"]) for r in per_rank
    ] == want
