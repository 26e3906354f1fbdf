"""The command line as a user meets it: help, typos, bad values, refusals, and the files it writes.

Bad input of any kind is one line on stderr and exit 2, never a traceback, naming the flag the user
actually gave. Most cases run in-process (``cli`` fixture, milliseconds); the few that need a real
process group or torchrun say why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checker.cli.main import COMMANDS, HELP_WIDTH, LAUNCH_COMMANDS, build_parser
from checker.files import append_file, write_file

KIMI = ["--model", "kimi-k3", "--budget-gib", "8"]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ---- help -------------------------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_and_help_fits_one_width(command):
    """A flag without help, or help wider than the rest, is what a new user trips over first."""
    sub = _subparsers()[command]
    missing = [a.option_strings[0] for a in sub._actions if a.option_strings and not a.help]
    assert missing == []
    text = sub.format_help()
    wide = [line for line in text.splitlines() if len(line) > HELP_WIDTH]
    assert wide == []


def test_check_help_names_the_environment_it_reads():
    text = _subparsers()["check"].format_help()
    for name in (
        "SGLANG_PP_LAYER_PARTITION",
        "SGLANG_MAMBA_CONV_DTYPE",
        "SGLANG_MAMBA_SSM_DTYPE",
        "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK",
        "GITHUB_STEP_SUMMARY",
        "CHECKER_HOSTNAME",
    ):
        assert name in text, name


def _help(command: str | None) -> str:
    return (build_parser() if command is None else _subparsers()[command]).format_help()


HELP_PAGES = [None, *COMMANDS]


@pytest.mark.parametrize("command", [None, *LAUNCH_COMMANDS])
def test_help_shows_the_launch_command_form(command):
    """The CI pattern (the deployment's launch command after --) is in every usage line a user greps:
    without it a new user never learns that the server's own command can be pasted."""
    text = _help(command)
    usage = text.split("\n\n")[0]
    assert usage.startswith("usage: ")
    assert "[checker options] -- <launch command>" in usage
    assert "<launch command> is the deployment's" in " ".join(text.split())  # and says what it is


@pytest.mark.parametrize("command", COMMANDS)
def test_help_examples_stand_one_a_line(command):
    """Every example is a line of its own, as written (the formatter re-wraps prose: examples that
    were prose ran together into one paragraph)."""
    from checker.cli.main import _command

    examples = _command(command).EXAMPLES
    assert len(examples) >= 2
    lines = _help(command).splitlines()
    for example in examples:
        assert f"  {example}" in lines, example
        assert len(example) + 2 <= HELP_WIDTH, example  # never wrapped by a terminal of the help's width
    if command in LAUNCH_COMMANDS:  # postflight reads logs: no launch command
        assert any(" -- " in e for e in examples), "no example shows a launch command"


@pytest.mark.parametrize("command", HELP_PAGES)
def test_help_has_no_markup_or_internal_notes(command):
    """The help is for a user: no reStructuredText, no notes on the code's internals."""
    text = _help(command)
    for needle in ("``", ":mod:", ":func:", ":class:", ":data:", " -> ", "checker.commands", "checker.cli"):
        assert needle not in text, needle


@pytest.mark.parametrize("command", HELP_PAGES)
def test_help_environment_is_one_table_then_one_note(command):
    """The environment variables a command reads are a table of NAME  meaning rows; what check does
    with them is said once, after the table, not as a row in its middle."""
    text = _help(command)
    block = text[text.index("environment variables read:") :].split("\n\n")
    rows = block[0].splitlines()[1:]
    assert rows and all(re.match(r"^  [A-Z][A-Z_, .]+ {2,}\S", row) for row in rows), rows
    names = " ".join(row.split("  ")[1] for row in rows)
    if command in (None, "check"):
        assert "GITHUB_STEP_SUMMARY" in names and "compares every rank's" in block[1]
    if command in ("derive", "plan"):  # one process: no torchrun, nothing compared across ranks
        assert "RANK" not in names and "compares" not in text[text.index("environment variables read") :]


def _example_argv(example: str) -> list[str]:
    """An example as main() receives it: the shell's words after `-m checker`, $SGLANG_LAUNCH expanded
    as the CI variable would be, the trailing comment dropped."""
    launch = "python -m sglang.launch_server --model-path /models/M --pp-size 2 --tp-size 4"
    words = shlex.split(example.replace("$SGLANG_LAUNCH", launch), comments=True)
    return words[words.index("checker") + 1 :]


def _examples() -> list[str]:
    from checker.cli.main import _command

    return [e for c in COMMANDS for e in _command(c).EXAMPLES if not e.startswith("#")]


@pytest.mark.parametrize("example", _examples())
def test_help_examples_parse(example):
    """Every example a user copies from --help is accepted as written: the checker's flags by its own
    parser, the launch command after -- by the release's flag table (the model path need not exist)."""
    from checker.cli.main import join_negative_values, with_default_command
    from checker.launch.command import parse_launch_command
    from checker.launch.merge import split_launch_command

    ours, launch = split_launch_command(_example_argv(example))
    build_parser().parse_args(join_negative_values(with_default_command(ours)))
    if launch is not None:
        parse_launch_command(launch, release=None, prefer_installed=False, check_model_path=False)


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["drive"], "did you mean derive?"),
        (["derive", "--budget-gb", "3"], "did you mean --budget-gib?"),
        (["check", "--modle", "kimi-k3"], "did you mean --model?"),
        (["sweep", "--budgets", "4:8:1", "--polcy", "max-share"], "did you mean --policy?"),
    ],
)
def test_typos_get_did_you_mean(cli, argv, suggestion):
    res = cli(argv)
    assert res.rc == 2
    assert len(res.err.strip().splitlines()) == 1 and suggestion in res.err


# ---- the preflight cannot pass by accident ------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--budget-gib", "8", "--allow-single-rank"], "give a model: --model NAME"),
        (["--model", "kimi-k3", "--allow-single-rank"], "give a budget source"),
        (
            ["--model", "kimi-k3", "--budget-gib", "8", "--budget-from-device", "--allow-single-rank"],
            "two budget sources",
        ),
        (KIMI, "pass --allow-single-rank"),
    ],
)
def test_check_requires_model_budget_and_a_real_world(cli, argv, needle):
    """Without torchrun (world 1), without a model or without a budget source, check refuses instead
    of checking the built-in preset at 8 GiB on one rank and printing CONSISTENT."""
    res = cli(["check", *argv])
    assert res.rc == 2, res
    assert len(res.err.strip().splitlines()) == 1 and needle in res.err, res.err
    assert "CONSISTENT" not in res.out


KIMI_LINEAR = str(FIXTURES / "kimi_linear_48b_a3b.json")
SERVE_KIMI = ["python", "-m", "sglang.launch_server", "--model-path", KIMI_LINEAR]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "kimi-k3", "--budget-from-device", "--device-free-gib", "79"],
        ["--budget-from-device", "--device-free-gib", "79", "--", *SERVE_KIMI, "--tp-size", "1"],
    ],
    ids=["flags", "launch-command"],
)
def test_budget_from_device_without_a_fraction_is_refused_not_sized_with_0_9(cli, argv):
    """A launch command without --mem-fraction-static runs with the fraction SGLang picks from the GPU
    and the serving mode (0.5.23 arg_groups/memory_hook.py), which the checker does not model: check
    refused nothing and sized the pool with 0.9. Now one line naming the flag to add, as derive
    --gpu-free-gib does; with the fraction (as a flag, or in the launch command) it derives."""
    res = cli(["check", "--allow-single-rank", *argv])
    (line,) = res.err.strip().splitlines()
    assert res.rc == 2 and "CONSISTENT" not in res.out, res
    assert "--budget-from-device needs the server's --mem-fraction-static" in line, line
    assert "add --mem-fraction-static F" in line, line
    given = [*argv, "--mem-fraction-static", "0.85"]  # after --: the launch command's own flag
    ok = cli(["check", "--allow-single-rank", *given])
    assert ok.rc == 0, ok.err[-400:]
    assert "--mem-fraction-static 0.85" in ok.out, ok.out


# ---- bad values: one line, the flag the user gave, exit 2 ----------------------------------------------


BAD_CHECK = [
    (["--budget-gib", "1e308"], "--budget-gib 1e308"),
    (["--budget-gib", "nan"], "--budget-gib"),
    (["--mamba-full-memory-ratio", "1e308"], "--mamba-full-memory-ratio 1e308"),
    (["--timeout-s", "1e10"], "--timeout-s 1e10"),
    (["--timeout-s", "0"], "--timeout-s 0"),
    (["--timeout-s", "-5"], "--timeout-s -5"),
    (["--mem-fraction-static", "5"], "--mem-fraction-static 5"),
    (["--mem-fraction-static", "-0.5"], "--mem-fraction-static -0.5"),
    (["--mamba-ssm-dtype", ""], "--mamba-ssm-dtype"),
    (["--pp-size", "5000"], "--pp-size 5000"),
    (["--device-free-gib", "1e308"], "--device-free-gib 1e308"),
    (["--init-method", "tcp://x:1"], "--init-method"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_CHECK, ids=[" ".join(a) for a, _ in BAD_CHECK])
def test_bad_values_are_one_line_naming_the_flag(cli, extra, needle):
    base = ["check", "--model", "kimi-k3", "--allow-single-rank"]
    if not any(a.startswith("--budget") for a in extra) and "--mem-fraction-static" not in extra:
        base += ["--budget-gib", "8"]
    if "--mem-fraction-static" in extra or "--device-free-gib" in extra:
        base += ["--budget-from-device"]
    res = cli([*base, *extra])
    lines = res.err.strip().splitlines()
    assert res.rc == 2 and len(lines) == 1 and needle in lines[0], res
    assert "Traceback" not in res.err and "--budget-gib -5" not in res.err


def test_negative_values_reach_the_flag_that_reads_them(cli):
    """``--budgets -1,2`` is the budget list's error, not argparse's "expected one argument"."""
    res = cli(["sweep", "--budgets", "-1,2", "--no-progress"])
    assert res.rc == 2 and "--budgets '-1,2': -1 must be a positive number" in res.err


def test_sweep_budget_beyond_any_device_is_refused(cli):
    res = cli(["sweep", "--budgets", "1e308:1e308:1", "--no-progress"])
    assert res.rc == 2 and "above 1,048,576 GiB" in res.err and "Traceback" not in res.err


# ---- files the user asked for --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "sweep"])
def test_a_directory_or_a_path_under_a_file_is_refused(cli, tmp_path, command):
    base = ["check", *KIMI, "--allow-single-rank"] if command == "check" else ["sweep", "--no-progress"]
    (tmp_path / "file.json").write_text("{}")
    for path, needle in ((tmp_path, "is a directory"), (tmp_path / "file.json" / "x", "is a file, not")):
        res = cli([*base, "--report", str(path)])
        assert res.rc == 2 and needle in res.err, res
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]  # nothing left behind


def test_report_gets_the_umask_mode_goes_through_symlinks_and_leaves_no_temp_file(tmp_path):
    old = os.umask(0o027)
    try:
        assert write_file(str(tmp_path / "r.json"), "{}", what="--report") is None
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o640
    target = tmp_path / "real.json"
    target.write_text("old")
    (tmp_path / "link.json").symlink_to(target)
    assert write_file(str(tmp_path / "link.json"), "new", what="--report") is None
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "r.json", "real.json"]


def test_a_step_summary_nobody_reads_is_bounded(tmp_path):
    """GITHUB_STEP_SUMMARY as a FIFO with no reader blocks open() forever: the write gives up in time."""
    fifo = tmp_path / "summary"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    problem = append_file(str(fifo), "x", what="GITHUB_STEP_SUMMARY", seconds=0.5)
    assert problem is not None and "a FIFO that no process opened for reading" in problem
    assert time.monotonic() - t0 < 2


# ---- under torchrun: a usage error is one line and an error report --------------------------------------


@pytest.mark.slow
def test_usage_error_under_torchrun_writes_an_error_report_and_prints_once(tmp_path):
    """Every rank parses the same bad command line: rank 0 alone prints it and writes the report CI
    reads, so the job is `error` (exit 2), not an infrastructure failure without a report."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            "-m",
            "checker",
            *KIMI,
            "--polcy",
            "own-share",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0
    doc = json.loads(report.read_text())
    assert doc["status"] == "error" and doc["exit_code"] == 2
    assert "did you mean --policy?" in doc["errors"][0]
    # Printed once by the checker (torchrun's own summary quotes it again, from its error file).
    printed = [line for line in proc.stderr.splitlines() if "unrecognized arguments: --polcy" in line]
    assert len([line for line in printed if "traceback :" not in line]) == 1, proc.stderr[-2000:]


# ---- a stale rendezvous store --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_store_left_by_an_earlier_run_is_refused(tmp_path):
    """A reused --init-method file holds an earlier run's keys (its liveness marks would name the wrong
    ranks): every rank refuses it with one line and exit 2."""
    from harness import run_world

    store = tmp_path / "store"
    earlier = (
        "import os, torch.distributed as d\n"
        f"s = d.PrefixStore('checker/0/', d.FileStore({str(store)!r}, 2))\n"
        "s.add('arrivals', 2)\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", earlier], check=True, timeout=60)
    res = run_world(
        ["check", *KIMI, "--timeout-s", "20"], world_size=2, tmp_path=tmp_path, init_method=f"file://{store}"
    )
    assert res.codes == [2, 2], [r.stderr[-500:] for r in res.ranks]
    assert "already holds an earlier run" in res.report()["errors"][0]


def test_report_paths_exist_only_where_asked(tmp_path: Path, cli):
    """derive --format json prints one object and writes nothing."""
    res = cli(["derive", "--model", "kimi-k3", "--format", "json"])
    assert res.rc == 0 and json.loads(res.out)["ranks"]
    assert list(tmp_path.iterdir()) == []


def test_model_path_takes_a_model_directory(cli, tmp_path, fixtures_dir):
    """SGLang users pass the model directory (--model-path): DIR/config.json is read."""
    model = tmp_path / "Qwen3.5-397B-A17B"
    model.mkdir()
    (model / "config.json").write_text((fixtures_dir / "qwen3_5_397b_a17b.json").read_text())
    by_dir = cli(["derive", "--model-path", str(model), "--pp-size", "4", "--format", "json"])
    by_file = cli(
        [
            "derive",
            "--model-config",
            str(fixtures_dir / "qwen3_5_397b_a17b.json"),
            "--pp-size",
            "4",
            "--format",
            "json",
        ]
    )
    assert by_dir.rc == by_file.rc == 0
    assert json.loads(by_dir.out)["ranks"] == json.loads(by_file.out)["ranks"]


def test_a_cpu_torch_without_numpy_stays_quiet():
    """torch warns "Failed to initialize NumPy" once per rank when numpy is missing; the CLI filters it
    (a real numpy-less venv is too slow to build here: the filter itself is what is tested)."""
    import warnings

    from checker.cli.main import quiet_torch_import

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_torch_import()
        warnings.warn("Failed to initialize NumPy: No module named 'numpy'", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]


# ---- issue 27 item 6: the smaller items ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["derive", "--attn-dp-size", "2"],
            "checker derive: error: unrecognized arguments: --attn-dp-size; --attn-dp-size is a flag of "
            "SGLang's launch command, not of the checker: give it in the launch command after -- (checker "
            "derive [checker options] -- python -m sglang.launch_server ... --attn-dp-size ...), or use the "
            "checker's own --dp-size (the attention DP size) (see checker derive --help)",
        ),
        (
            ["check", "--context-length", "4096"],
            "checker check: error: unrecognized arguments: --context-length; --context-length is a flag of "
            "SGLang's launch command, not of the checker: give it in the launch command after -- (checker "
            "check [checker options] -- python -m sglang.launch_server ... --context-length ...), or use the "
            "checker's own --context-len (see checker check --help)",
        ),
    ],
)
def test_a_launch_flag_among_the_checkers_is_told_where_it_goes(cli, argv, line):
    """--attn-dp-size was answered "did you mean --tp-size?", another setting than the one meant."""
    res = cli(argv)
    assert (res.rc, res.err.strip()) == (2, line)


def test_an_unknown_flag_is_echoed_escaped(cli):
    """A terminal escape in a word the user typed is shown, never acted on by the terminal."""
    res = cli(["derive", "--x\x1b[31mred\nnext"])
    assert res.rc == 2 and "\x1b" not in res.err and "\\x1b[31mred\\nnext" in res.err
    assert len(res.err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["derive", "plan", "check"])
def test_an_empty_model_name_is_refused_not_the_default(cli, command):
    """`--model ""` (an unset CI variable) checked kimi-k3 without a word."""
    res = cli([command, "--model", "", "--budget-gib", "8"])
    assert res.rc == 2 and res.out == ""
    assert f"checker {command}: error: --model '' must be a preset name (kimi-k3)" in res.err


@pytest.mark.parametrize("device", ["meta", "mps"])
def test_sweep_on_a_device_it_cannot_derive_on_is_one_line(cli, device):
    """--device meta ended in a 30-line traceback (Tensor.item() on a meta tensor)."""
    res = cli(["sweep", "--model", "kimi-k3", "--budgets", "8", "--device", device])
    assert res.rc == 2 and "Traceback" not in res.err
    (line,) = res.err.strip().splitlines()
    assert line.startswith(
        f"checker sweep: error: --device {device}: the sweep derives on cpu or cuda[:N] only"
    )


def test_a_flag_repeated_20000_times_is_parsed_once(cli, monkeypatch):
    """--budget-gib 8 repeated 20,000 times, then 9: argparse alone is quadratic in the options it reads
    (10.9 s on this machine). What it reads is the command with the repeats collapsed (the last value
    wins, as argparse's own reading), a few words whatever the count."""
    import argparse
    import json

    seen: list[int] = []
    real = argparse.ArgumentParser.parse_known_args

    def spy(self, args=None, namespace=None):
        seen.append(len(args or ()))
        return real(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    res = cli(
        [
            "derive",
            "--model",
            "kimi-k3",
            *["--budget-gib", "8"] * 20_000,
            "--budget-gib",
            "9",
            "--format",
            "json",
        ]
    )
    assert res.rc == 0, res.err
    assert json.loads(res.out)["inputs"]["budget_gib"] == 9.0
    assert max(seen) < 20, seen
