"""The launch command after ``--`` through the real CLI: each family's realistic command derives what the
same deployment spelled in checker flags derives, the refusals are one line, and on real ranks a node
started with a different command is named.

The expected values are independent of the launch-command code: the same deployment written by hand
in the checker's own flags (the translation a user would otherwise make), derived by the core.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
from harness import run_world

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SERVE = ["python", "-m", "sglang.launch_server"]
NOISE = ["--host", "0.0.0.0", "--port", "30000", "--trust-remote-code", "--served-model-name", "prod"]

# family fixture -> (launch flags, the same in checker flags)
FAMILIES = {
    # Qwen3-Next, Falcon-H1 and Granite-4.0-H start at one pipeline stage only (their constructor asserts
    # it, or load_weights has no stage filter: checker/core/releases/pp_support.py): their GPUs go to TP here.
    "qwen3_next_80b_a3b.json": (
        ["--pp-size", "1", "--tp-size", "8", "--mem-fraction-static", "0.85"],
        ["--pp-size", "1", "--tp-size", "8"],
    ),
    "qwen3_5_397b_a17b.json": (
        ["--pipeline-parallel-size", "4", "--tensor-parallel-size", "4", "--max-running-requests", "64"],
        ["--pp-size", "4", "--tp-size", "4", "--max-running-requests", "64"],
    ),
    "kimi_linear_48b_a3b.json": (
        [
            *("--pp-size", "2", "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention"),
            *("--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"),
        ],
        [
            *("--pp-size", "2", "--tp-size", "2", "--dp-size", "2"),  # attention TP = tp / attention dp
            *("--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"),
        ],
    ),
    "nemotron_h_8b.json": (
        ["--pp-size", "8", "--disable-radix-cache", "--max-running-requests", "32"],
        ["--pp-size", "8", "--disable-radix-cache", "--max-running-requests", "32"],
    ),
    "falcon_h1_0_5b.json": (
        ["--tp-size", "2", "--mamba-full-memory-ratio", "0.5", "--context-length", "8192"],
        # derive's own default is --pp-size 8; SGLang's is 1, which the launch command leaves to it
        ["--pp-size", "1", "--tp-size", "2", "--mamba-full-memory-ratio", "0.5", "--context-len", "8192"],
    ),
    "granite_4_0_h_small.json": (
        ["--pp-size", "1", "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention"],
        ["--pp-size", "1", "--tp-size", "2", "--dp-size", "2"],  # attention TP = tp / attention dp
    ),
}


def _model_dir(tmp_path: Path, fixture: str) -> Path:
    model = tmp_path / fixture.removesuffix(".json")
    model.mkdir()
    shutil.copy(FIXTURES / fixture, model / "config.json")
    return model


@pytest.mark.parametrize("fixture", sorted(FAMILIES))
def test_a_realistic_launch_command_derives_what_the_same_flags_derive(cli, tmp_path, fixture):
    launch, ours = FAMILIES[fixture]
    model = _model_dir(tmp_path, fixture)
    by_launch = cli(
        [
            "derive",
            "--budget-gib",
            "40",
            "--format",
            "json",
            "--",
            *SERVE,
            "--model-path",
            str(model),
            *launch,
            *NOISE,
        ]
    )
    by_hand = cli(["derive", "--budget-gib", "40", "--format", "json", "--model-config", str(model), *ours])
    assert by_launch.rc == by_hand.rc == 0, (by_launch.err, by_hand.err)
    a, b = json.loads(by_launch.out), json.loads(by_hand.out)
    assert a["ranks"] == b["ranks"] and a["layout"] == b["layout"]


@pytest.mark.parametrize(
    ("ours", "launch", "needle"),
    [
        (
            ["--tp-size", "4"],
            ["--tp-size", "2"],
            "--tp-size 4 and --tp-size 2 in the launch command disagree",
        ),
        (["--model", "kimi-k3"], [], "name two models"),
        ([], ["--no-such-flag", "1"], "does not know --no-such-flag"),
        ([], ["--tp-size", "two"], "refuses the launch command"),
    ],
)
def test_refusals_are_one_line(cli, tmp_path, ours, launch, needle):
    model = _model_dir(tmp_path, "qwen3_next_80b_a3b.json")
    res = cli(["derive", *ours, "--", *SERVE, "--model-path", str(model), *launch])
    lines = res.err.strip().splitlines()
    assert res.rc == 2 and len(lines) == 1 and needle in lines[0], res.err


def test_equal_values_in_both_places_are_fine(cli, tmp_path):
    model = _model_dir(tmp_path, "qwen3_next_80b_a3b.json")
    res = cli(
        [
            "derive",
            "--tp-size",
            "2",
            "--model-config",
            str(model / "config.json"),
            "-q",
            "--",
            *SERVE,
            "--model-path",
            str(model),
            "--tp-size",
            "2",
            "--pp-size",
            "1",
        ]
    )
    assert res.rc == 0, res.err


@pytest.mark.parametrize("launch", [[], ["vllm", "serve", "m"]])
def test_a_missing_or_foreign_launch_command_is_refused(cli, launch):
    res = cli(["derive", "--", *launch])
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1


@pytest.mark.slow
def test_check_on_real_ranks_names_a_node_started_differently(tmp_path):
    """Two ranks (pp 2), the same model; rank 1's command adds --max-running-requests 8. Each rank
    parses its own command: the values diverge and the report names the flag, alone (the launch_command
    input carries only what no other input does, so one flag changed is one cause). Qwen3.5: a class
    that starts under PP (Qwen3-Next asserts a single stage)."""
    model = _model_dir(tmp_path, "qwen3_5_397b_a17b.json")
    base = [
        "check",
        "--budget-gib",
        "40",
        "--timeout-s",
        "30",
        "--",
        *SERVE,
        "--model-path",
        str(model),
        "--pp-size",
        "2",
        *NOISE,
    ]
    same = run_world(base, world_size=2, tmp_path=tmp_path)
    assert same.codes == [0, 0], [r.stderr[-400:] for r in same.ranks]
    rep = same.report()
    assert rep["status"] == "consistent"
    # The flags compared as inputs of their own (pp_size, the model) are not in the launch_command input.
    assert rep["inputs"]["launch_command"] == "python -m sglang.launch_server"
    assert rep["inputs"]["pp_size"] == 2
    launch = base[base.index("--") + 1 :]
    assert rep["launch_command"]["argv"] == launch and rep["launch_command"]["groups"][0]["ranks"] == [0, 1]
    other = run_world(
        base, world_size=2, tmp_path=tmp_path, rank_argv={1: [*base, "--max-running-requests", "8"]}
    )
    assert other.codes == [1, 1], [r.stderr[-400:] for r in other.ranks]
    rep = other.report()
    assert rep["status"] == "divergent"
    assert rep["differing_inputs"] == ["max_running_requests"]
    (cause,) = rep["root_causes"]
    assert cause.endswith("rank 1 has --max-running-requests=8 (on " + rep["ranks"][1]["host"] + ")"), cause
    # The report keeps rank 0's whole command; its groups follow the whole command (issue 27: they
    # followed the launch_command input, which leaves out the flags compared as inputs of their own, and
    # put rank 1 in rank 0's group).
    assert rep["launch_command"]["argv"] == launch
    assert [g["ranks"] for g in rep["launch_command"]["groups"]] == [[0], [1]]


@pytest.mark.slow
def test_check_on_real_ranks_lays_out_attention_dp_as_sglang_does(tmp_path):
    """SGLang's world is pp x its --tp-size, with attention DP inside the TP group: pp 2 x tp 2 with
    2-way attention DP is 4 ranks, ranks 0-1 stage 0 and 2-3 stage 1. It was refused as "world_size 4
    is not pp_size x tp_size = 2 x 1" (the attention TP width alone), and 2 ranks of tp 2 with attention
    DP as "1 x 1"; a world the command does not ask for names the whole group. Kimi-Linear: a class that
    starts under PP (Granite-4.0-H's load_weights has no stage filter)."""
    model = _model_dir(tmp_path, "kimi_linear_48b_a3b.json")
    base = ["check", "--budget-gib", "40", "--timeout-s", "30", "--", *SERVE, "--model-path", str(model)]
    dp = ["--tp-size", "2", "--enable-dp-attention", "--dp-size", "2"]
    four = run_world([*base, "--pp-size", "2", *dp], world_size=4, tmp_path=tmp_path)
    assert four.codes == [0, 0, 0, 0], [r.stderr[-400:] for r in four.ranks]
    rep = four.report()
    assert rep["status"] == "consistent"
    assert [r["pp_rank"] for r in rep["ranks"]] == [0, 0, 1, 1]
    assert rep["inputs"]["tp_size"] == 1 and rep["inputs"]["dp_size"] == 2
    two = run_world([*base, "--pp-size", "2", *dp], world_size=2, tmp_path=tmp_path)
    assert two.codes == [2, 2], [r.stderr[-400:] for r in two.ranks]
    (error,) = two.report()["errors"]
    assert "world_size 2 is not pp_size x tp_size = 2 x 2 (attention TP 1 x attention DP 2)" in error, error
    assert "--nproc-per-node 4" in error


@pytest.mark.slow
def test_check_on_real_ranks_keeps_a_long_launch_command_whole(tmp_path):
    """A model path longer than the wire's 120 bytes (an organisation and a revision in it): the report
    holds the command as given (argv, text, its sha256 as `printf %s "$CMD" | sha256sum` prints it) and
    the model path whole, not the wire's cut text; the terminal shows the path whole too."""
    deep = tmp_path / "an-organisation-with-a-long-name" / "models-mirrored-from-the-hub" / "qwen3.5"
    deep.mkdir(parents=True)
    model = _model_dir(deep, "qwen3_5_397b_a17b.json")
    model = model.rename(deep / "Qwen3.5-397B-A17B-Instruct-FP8-rev-2026")
    assert len(str(model / "config.json")) > 120
    launch = [*SERVE, "--model-path", str(model), "--pp-size", "2", *NOISE]
    res = run_world(
        ["check", "--budget-gib", "40", "--timeout-s", "30", "--", *launch], world_size=2, tmp_path=tmp_path
    )
    assert res.codes == [0, 0], [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    lc = rep["launch_command"]
    assert lc["argv"] == launch and shlex.split(lc["text"]) == launch
    assert lc["sha256"] == hashlib.sha256(shlex.join(launch).encode()).hexdigest()
    assert rep["inputs"]["model"].startswith(f"{model}/config.json (qwen3_5_moe) #")  # whole, not cut
    assert str(model / "config.json") in res.ranks[0].stdout
