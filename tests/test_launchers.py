"""The launch recipes in launchers/: every checker command line in them is accepted by the checker's own
parser (and the deployment's launch command after its ``--`` by the launch-command parser), the torchrun
line they build is accepted by torchrun's, every recipe bounds its job in time, the verdict reader trusts
only a consistent report, and the CPU smoke recipe and a launch command really run.

A recipe nobody runs rots: a renamed flag, a knob spelled differently in one recipe, a torchrun option
that moved. These tests read the recipes as text and YAML, so they fail the moment one drifts.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from checker.status import EXIT_CODES, STATUSES

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = REPO_ROOT / "launchers"
TORCHRUN_SH = LAUNCHERS / "torchrun.sh"
READ_VERDICT = LAUNCHERS / "read-verdict.sh"
RECIPES = [
    "torchrun.sh",
    "read-verdict.sh",
    "slurm.sbatch",
    "k8s-pytorchjob.yaml",
    "github-actions.yml",
    "gitlab-ci.yml",
]
SHELL_SCRIPTS = ["torchrun.sh", "read-verdict.sh", "slurm.sbatch"]
KNOB_NAMES = re.compile(r"\b(NNODES|NPROC\w*|NODE_RANK|RDZV_\w+|LOCAL_ADDR|BACKEND|JOB_TIMEOUT\w*)\b")
# Variables a recipe may define for itself on top of torchrun.sh's knobs.
OWN_VARIABLES = {"slurm.sbatch": {"RDZV_PORT"}}
SUBPROCESS_TIMEOUT_S = 60
KIMI = ["--model", "kimi-k3", "--budget-gib", "8"]
"""A complete checker command line: check needs a model and a budget source."""
MODEL_FLAGS = ("--model", "--model-config", "--model-path")
BUDGET_FLAGS = ("--budget-gib", "--budget-from-device")
SERVE = ["python", "-m", "sglang.launch_server"]
FIXTURES = REPO_ROOT / "tests" / "fixtures"
LAUNCH_DEFINITION = re.compile(
    r"^(\w+)=\"((?:python\S* -m sglang\.launch_server|sglang serve)\b[^\"]*)\"$", flags=re.M
)
"""A shell variable holding a launch command (``SERVE="python -m sglang.launch_server ..."``)."""


def yaml_or_skip():
    return pytest.importorskip("yaml", reason="PyYAML reads the CI and Kubernetes recipes")


# -- reading recipes --------------------------------------------------------------------------------------


def shell_lines(text: str) -> list[str]:
    """Logical shell lines: backslash continuations joined; comment lines kept without their '#', since
    usage examples live in comments and must not rot either."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            line = line.lstrip("#").strip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    return lines + ([current] if current else [])


def expand(token: str) -> str:
    """``${VAR:-default}`` -> default; ``$VAR`` / ``${VAR}`` -> VAR (a placeholder a string flag accepts;
    a numeric flag given a bare variable fails, as it should: the recipe shows a value)."""
    token = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", token)
    return re.sub(r"\$\{?(\w+)\}?", r"\1", token)


LAUNCHER_SCRIPTS = ("launchers/torchrun.sh", "launchers/slurm.sbatch")
"""Scripts whose arguments all go to the checker."""


PASSTHROUGH = ("$@", "...")
"""``$@``: the script's own arguments; ``...``: elided in an example. Either may hold the model."""


def launch_definitions(text: str) -> dict[str, str]:
    """The launch commands a recipe defines once and expands in several places: shell assignments
    (``SERVE="python -m sglang.launch_server ..."``, in code or in a usage comment) and, in the YAML
    recipes, the ``SGLANG_LAUNCH`` of a job's env / variables or a pod's env."""
    found = {}
    for line in shell_lines(text):
        m = LAUNCH_DEFINITION.match(line)
        if m:
            found[m.group(1)] = m.group(2)
    if "SGLANG_LAUNCH" in text:
        yaml = yaml_or_skip()

        def walk(node):
            if isinstance(node, dict):
                if isinstance(node.get("SGLANG_LAUNCH"), str):
                    found["SGLANG_LAUNCH"] = node["SGLANG_LAUNCH"]
                if node.get("name") == "SGLANG_LAUNCH" and isinstance(node.get("value"), str):
                    found["SGLANG_LAUNCH"] = node["value"]
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(yaml.safe_load(text))
    return found


def substitute_launch(text: str) -> str:
    """``$VAR`` / ``${VAR}`` of every launch command the text defines -> that command's words."""
    for name, value in launch_definitions(text).items():
        text = re.sub(rf"\$(\{{{name}\}}|{name}\b)", lambda _m, v=value: v, text)
    return text


def checker_invocations(
    text: str, *, keep_passthrough: bool = False, bare_torchrun: bool = False
) -> list[list[str]]:
    """The checker arguments of every ``.../torchrun.sh ARGS`` (or ``slurm.sbatch ARGS``) command line,
    after the launch commands the text defines are expanded; ``keep_passthrough``: keep ``$@`` and
    ``...`` as tokens; ``bare_torchrun``: also ``torchrun ... -m checker ARGS`` (the README's)."""
    found = []
    starts_with = LAUNCHER_SCRIPTS + (("-m checker",) if bare_torchrun else ())
    for line in shell_lines(substitute_launch(text)):
        if not any(script in line for script in starts_with):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        try:
            tokens = list(lexer)
        except ValueError:  # prose with an apostrophe, not a command
            continue
        starts = [i for i, t in enumerate(tokens) if t.endswith(LAUNCHER_SCRIPTS)]
        if bare_torchrun:
            starts += [i + 1 for i, t in enumerate(tokens[:-1]) if t == "-m" and tokens[i + 1] == "checker"]
        for start in starts:
            args = []
            for tok in tokens[start + 1 :]:
                if tok and set(tok) <= set("|&;<>()"):
                    break  # a shell operator ends the command
                if tok.startswith("#"):
                    break  # a trailing comment
                if tok in PASSTHROUGH and keep_passthrough:
                    args.append(tok)
                elif tok not in PASSTHROUGH:
                    args.append(expand(tok))
            found.append(args)
    return found


def split_launch(args: list[str]) -> tuple[list[str], list[str] | None]:
    """``[checker args] -- [launch command]`` -> the two halves, as the checker's CLI splits them."""
    from checker.launch.merge import split_launch_command

    return split_launch_command(args)


def names_a_model(args: list[str]) -> bool:
    """The checker half names a model, or the launch command after ``--`` gives ``--model-path``."""
    ours, launch = split_launch(args)
    names = {a.split("=", 1)[0] for a in ours}
    return bool(names & set(MODEL_FLAGS)) or any(a.split("=", 1)[0] == "--model-path" for a in launch or [])


def names_a_budget(args: list[str]) -> bool:
    """A budget source is the checker's own flag: it must come before ``--``."""
    return bool({a.split("=", 1)[0] for a in split_launch(args)[0]} & set(BUDGET_FLAGS))


def completed(args: list[str]) -> list[str]:
    """A command line that passes its caller's arguments on (or elides some) gets the model and budget
    source it lacks from those: what a user must add. Others are returned as they are."""
    if not any(a in PASSTHROUGH for a in args):
        return args
    args = [a for a in args if a not in PASSTHROUGH]
    extra = ([] if names_a_model(args) else KIMI[:2]) + ([] if names_a_budget(args) else KIMI[2:])
    return [*extra, *args] if args[:1] != ["check"] else ["check", *extra, *args[1:]]


def fenced_code(markdown: str) -> str:
    return "\n".join(re.findall(r"```[a-z]*\n(.*?)```", markdown, flags=re.S))


class CheckerRejects(Exception):
    """The checker's parser refused a command line (its one-line message)."""


def parse_checker(args: list[str]):
    """The checker's own parser, as ``torchrun -m checker`` runs it; a refusal raises CheckerRejects.

    With ``-- LAUNCH``: the checker's flags before it by the checker's parser, the launch command by
    :func:`checker.launch.command.parse_launch_command` (its model path need not exist here), and a
    sizing input given in both halves must have one value (the CLI refuses the run otherwise). The
    namespace gets ``launch`` (the parsed launch command, or None)."""
    import argparse

    from checker.cli import main as cli
    from checker.cli.namespace import given_dests
    from checker.core.errors import FlagError
    from checker.launch.command import parse_launch_command
    from checker.launch.merge import CHECKER_FLAG

    ours, launch = split_launch(args)
    words = cli.with_default_command(ours)
    try:
        parser = cli.build_parser()
        ns = parser.parse_args(words)
    except SystemExit as exc:
        raise CheckerRejects(f"exit {exc.code}") from exc
    except getattr(cli, "UsageError", ()) as exc:
        raise CheckerRejects(str(exc)) from exc
    ns.launch = None
    if launch is None:
        return ns
    release = getattr(ns, "sglang_version", None)
    try:
        cmd = parse_launch_command(launch, release=release, check_model_path=False)
    except FlagError as exc:
        raise CheckerRejects(f"launch command: {exc}") from exc
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[ns.command]
    given = given_dests(sub, words[1:])
    if getattr(ns, "model", None) and "model_config" in cmd.explicit:
        raise CheckerRejects("--model and the launch command's --model-path name two models")
    for key in sorted(given & cmd.explicit & set(CHECKER_FLAG)):
        ours_value, theirs = getattr(ns, key, None), cmd.values[key]
        if key == "model_config":
            same = str(ours_value).removesuffix("/config.json") == str(theirs).removesuffix("/config.json")
        elif isinstance(theirs, float):
            same = math.isclose(float(ours_value), theirs, rel_tol=0, abs_tol=1e-12)
        else:
            same = ours_value == theirs
        if not same:
            flag = CHECKER_FLAG[key]
            raise CheckerRejects(f"{flag} {ours_value} and the launch command's {theirs} disagree")
    ns.launch = cmd
    return ns


def torchrun_knobs() -> set[str]:
    return set(re.findall(r'^([A-Z_]+)="\$\{\1:-', TORCHRUN_SH.read_text(), flags=re.M))


# -- every recipe ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RECIPES)
def test_checker_commands_in_recipe_parse(name, capsys):
    """Each recipe launches the checker at least once, and the checker's parser accepts every
    invocation; a renamed or removed flag shows here as the recipe's name and argparse's message."""
    invocations = checker_invocations((LAUNCHERS / name).read_text(), keep_passthrough=True)
    assert invocations, f"{name}: no launchers/torchrun.sh or slurm.sbatch command line found"
    for args in map(completed, invocations):
        try:
            ns = parse_checker(args)
        except CheckerRejects as exc:
            pytest.fail(
                f"{name}: checker rejects {shlex.join(args)}: {exc} {capsys.readouterr().err.strip()}"
            )
        assert ns.command == "check"


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_name_model_and_budget_explicitly(name):
    """A preflight that checks a default model or a default budget proves nothing about the deployment:
    every launch names its model and its budget source, unless it passes its caller's arguments on."""
    for args in checker_invocations((LAUNCHERS / name).read_text(), keep_passthrough=True):
        if any(a in PASSTHROUGH for a in args):
            continue  # e.g. slurm.sbatch's srun line: the model comes from sbatch's own arguments
        assert names_a_model(args), f"{name}: no {' or '.join(MODEL_FLAGS)} in {shlex.join(args)}"
        assert names_a_budget(args), f"{name}: no {' or '.join(BUDGET_FLAGS)} before -- in {shlex.join(args)}"
        # Without the weights' footprint the budget from the device is the free memory's, not the server's.
        ns = parse_checker(completed(args))
        assert not ns.budget_from_device or ns.weights_gib, f"{name}: no --weights-gib in {shlex.join(args)}"


def launch_forms(args: list[str]) -> list[str] | None:
    """The launch command after ``--`` when it is SGLang's server launch, else None."""
    launch = split_launch(args)[1]
    if launch and (launch[1:3] == ["-m", "sglang.launch_server"] or launch[:2] == ["sglang", "serve"]):
        return launch
    return None


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_show_the_launch_command_form(name):
    """Every recipe shows the deployment's own launch command after ``--`` at least once, parsed here as
    a complete command: model path and layout from the launch command, checker flags before it."""
    invocations = checker_invocations((LAUNCHERS / name).read_text(), keep_passthrough=True)
    shown = [args for args in invocations if launch_forms(args)]
    assert shown, f"{name}: no `... -- python -m sglang.launch_server ...` command line"
    for args in shown:
        ns = parse_checker(completed(args))
        assert "model_config" in ns.launch.explicit and "pp_size" in ns.launch.explicit, shlex.join(args)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--budget-gib", "8", "--", *SERVE, "--model-path", "/m", "--tp-size", "two"], "launch command"),
        (["--budget-gib", "8", "--", *SERVE, "--model-path", "/m", "--no-such-flag", "1"], "no-such-flag"),
        (
            ["--budget-gib", "8", "--tp-size", "4", "--", *SERVE, "--model-path", "/m", "--tp-size", "2"],
            "disagree",
        ),
        (["--budget-gib", "8", "--model", "kimi-k3", "--", *SERVE, "--model-path", "/m"], "two models"),
        (["--budget-gib", "8", "--", "vllm", "serve", "/m"], "launch command"),
    ],
)
def test_recipe_parsing_rejects_a_bad_launch_command(args, why):
    """The recipe parser above can fail: a launch command SGLang refuses, or one that contradicts a
    checker flag, is reported against the recipe (and the CLI refuses the same, tests/test_launch_e2e.py)."""
    with pytest.raises(CheckerRejects, match=why):
        parse_checker(args)
    assert parse_checker(["--budget-gib", "8", "--", *SERVE, "--model-path", "/m", "--tp-size", "2"]).launch


@pytest.mark.parametrize("doc", ["README.md", "docs/launchers.md"])
def test_doc_commands_parse(capsys, doc):
    """The code blocks of the README and of docs/launchers.md: same rule as the recipes."""
    text = fenced_code((REPO_ROOT / doc).read_text())
    invocations = checker_invocations(text, keep_passthrough=True, bare_torchrun=True)
    assert invocations, f"{doc} shows no checker command line"
    for args in map(completed, invocations):
        try:
            parse_checker(args)
        except CheckerRejects as exc:
            pytest.fail(f"{doc}: checker rejects {shlex.join(args)}: {exc} {capsys.readouterr().err.strip()}")


def test_readme_ci_section_uses_the_launch_command():
    """The README's CI section ("Use it in CI with a real model"): one node and several nodes, each with
    the deployment's launch command after ``--`` (model and layout from it, a budget source before it),
    then read-verdict.sh on the report it wrote."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Use it in CI with a real model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 2, "one node and several nodes"
    for block in blocks:
        invocations = checker_invocations(block, bare_torchrun=True)
        assert len(invocations) == 1, block
        (args,) = invocations
        ns = parse_checker(args)
        assert ns.launch is not None and {"model_config", "pp_size", "tp_size"} <= ns.launch.explicit, args
        assert names_a_budget(args) and ns.report, args
        # Without the weights' footprint the budget is the free memory's share, not the server's.
        assert not ns.budget_from_device or ns.weights_gib, args
        assert re.search(rf"launchers/read-verdict\.sh {re.escape(ns.report)}\s*$", block), block
    assert "NNODES=" in blocks[1] or "--nnodes" in blocks[1], blocks[1]


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_use_only_known_knobs(name):
    """A knob spelled differently in a recipe (NPROC=8, RDZV_ENDPOINTS=...) would be silently ignored."""
    known = torchrun_knobs() | OWN_VARIABLES.get(name, set())
    assert {
        "NNODES",
        "NPROC_PER_NODE",
        "NODE_RANK",
        "RDZV_ENDPOINT",
        "RDZV_ID",
        "LOCAL_ADDR",
        "BACKEND",
    } <= known
    used = set(KNOB_NAMES.findall((LAUNCHERS / name).read_text()))
    assert used <= known, f"{name} uses unknown knobs {sorted(used - known)}"


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_shell_scripts_are_valid_bash(name):
    res = subprocess.run(
        ["bash", "-n", str(LAUNCHERS / name)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert res.returncode == 0, res.stderr


def _yaml_shell_blocks(name: str) -> list[str]:
    """The shell each CI/Kubernetes recipe hands to bash: GitHub ``run``, GitLab ``script``, pod args."""
    yaml = yaml_or_skip()
    doc = yaml.safe_load((LAUNCHERS / name).read_text())
    if name == "github-actions.yml":
        return [s["run"] for job in doc["jobs"].values() for s in job["steps"] if "run" in s]
    if name == "gitlab-ci.yml":
        return ["\n".join(job["script"]) for job in doc.values() if isinstance(job, dict) and "script" in job]
    return [
        spec["template"]["spec"]["containers"][0]["args"][0]
        for spec in doc["spec"]["pytorchReplicaSpecs"].values()
    ]


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml", "k8s-pytorchjob.yaml"])
def test_embedded_shell_is_valid_bash(name):
    """The shell inside YAML recipes parses (bash -n), and each runs the checker and reads its verdict."""
    blocks = _yaml_shell_blocks(name)
    assert blocks
    for block in blocks:
        res = subprocess.run(
            ["bash", "-n"], input=block, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
        )
        assert res.returncode == 0, f"{name}: {res.stderr}\n{block}"
    launching = [b for b in blocks if "torchrun.sh" in b]
    assert launching and all("read-verdict.sh" in b for b in launching), launching


# -- torchrun.sh builds a torchrun command line torchrun accepts ----------------------------------------


REAL_TIMEOUT = shutil.which("timeout")
JOB_SLACK_S = int(re.search(r"^JOB_SLACK_S=(\d+)$", TORCHRUN_SH.read_text(), flags=re.M).group(1))


@dataclass
class FakeRun:
    code: int
    argv: list[str]
    """What torchrun was given ([] when it never started)."""
    timeout_argv: list[str]
    """What GNU timeout was given, torchrun's command line included."""
    err: str

    @property
    def bound_s(self) -> int:
        """Seconds after which timeout SIGTERMs torchrun."""
        return int(self._timeout_operands()[0])

    @property
    def kill_after_s(self) -> int:
        """Seconds after the SIGTERM at which timeout SIGKILLs torchrun."""
        opts = [a for a in self.timeout_argv if a.startswith("--kill-after=")]
        assert len(opts) == 1, self.timeout_argv
        return int(opts[0].split("=", 1)[1])

    def _timeout_operands(self) -> list[str]:
        i = next(i for i, a in enumerate(self.timeout_argv) if not a.startswith("-"))
        return self.timeout_argv[i:]


def run_with_fake_torchrun(tmp_path: Path, env: dict[str, str], args: list[str]) -> FakeRun:
    """Run torchrun.sh with a stand-in ``torchrun`` on PATH that records its argv (NUL-separated), and a
    ``timeout`` that records its argv and then runs the real one (so the bound is real, and recorded)."""
    if REAL_TIMEOUT is None:
        pytest.skip("no `timeout` command (GNU coreutils)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGV_OUT"\n')
    fake.chmod(0o755)
    fake_timeout = bin_dir / "timeout"
    fake_timeout.write_text(
        f'#!/bin/sh\nprintf \'%s\\0\' "$@" > "$TIMEOUT_ARGV_OUT"\nexec {REAL_TIMEOUT} "$@"\n'
    )
    fake_timeout.chmod(0o755)
    out, tout = tmp_path / "argv", tmp_path / "timeout_argv"
    out.unlink(missing_ok=True)
    tout.unlink(missing_ok=True)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in torchrun_knobs() and not k.startswith(("PET_", "SGLANG_", "TORCH_ELASTIC_"))
    }
    full = {
        **clean,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGV_OUT": str(out),
        "TIMEOUT_ARGV_OUT": str(tout),
        **env,
    }
    res = subprocess.run(
        ["bash", str(TORCHRUN_SH), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )

    def read(path: Path) -> list[str]:
        return path.read_bytes().decode().split("\0")[:-1] if path.exists() else []

    run = FakeRun(code=res.returncode, argv=read(out), timeout_argv=read(tout), err=res.stderr)
    if run.argv:
        # timeout really ran torchrun, with exactly the command line torchrun received.
        assert run._timeout_operands()[1:] == ["torchrun", *run.argv], run.timeout_argv
    return run


def parse_torchrun(argv: list[str]):
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


def test_single_node_is_standalone(tmp_path):
    """NNODES=1 (the default): --standalone, no endpoint; every argument reaches the checker verbatim."""
    run = run_with_fake_torchrun(
        tmp_path, {"NPROC_PER_NODE": "4"}, [*KIMI, "--report", "dir with space/r.json"]
    )
    assert run.code == 0, run.err
    t = parse_torchrun(run.argv)
    assert t.standalone and t.nproc_per_node == "4" and t.max_restarts == 0
    assert t.module and t.training_script == "checker"
    c = parse_checker(t.training_script_args)
    assert c.command == "check" and c.backend == "auto" and c.model == "kimi-k3"
    assert c.report == "dir with space/r.json"


@pytest.mark.parametrize("lead", [[], ["check"]])
def test_launch_command_passes_through_unchanged(tmp_path, lead):
    """Everything after torchrun.sh's own arguments reaches the checker as given: ``--`` and the launch
    command after it, word for word (a path with a space, a second ``--``, a word ``check``, SGLang flags
    that abbreviate nothing of the checker's); and only the checker's --timeout-s before ``--`` sets
    the job's bound."""
    ours = ["--budget-gib", "40", "--timeout-s", "20", "--report", "dir with space/r.json"]
    launch = [*SERVE, "--model-path", "/models/my model", "--pp-size", "2", "--timeout", "999"]
    launch += ["--dist-timeout", "5", "--host", "0.0.0.0", "--", "check", "--timeout-s=1"]
    run = run_with_fake_torchrun(tmp_path, {"NPROC_PER_NODE": "2"}, [*lead, *ours, "--", *launch])
    assert run.code == 0, run.err
    t = parse_torchrun(run.argv)
    assert t.module and t.training_script == "checker"
    assert t.training_script_args == ["check", "--backend", "auto", *ours, "--", *launch]
    assert run.bound_s == 20 + JOB_SLACK_S, run.timeout_argv


@pytest.mark.parametrize("node_rank,is_host", [("0", "1"), ("1", "0")])
def test_multi_node_uses_c10d_with_explicit_host_and_local_addr(tmp_path, node_rank, is_host):
    """NNODES=2: c10d rendezvous at RDZV_ENDPOINT; node 0 hosts the store (is_host=1) and the others do
    not, whatever their hostnames; LOCAL_ADDR becomes --local-addr; RDZV_CONF is appended."""
    env = {
        "NNODES": "2",
        "NPROC_PER_NODE": "2",
        "NODE_RANK": node_rank,
        "RDZV_ENDPOINT": "10.0.0.1:29400",
        "RDZV_ID": "job-7",
        "LOCAL_ADDR": "10.0.0.9",
        "BACKEND": "gloo",
        "RDZV_CONF": "join_timeout=9",
    }
    run = run_with_fake_torchrun(tmp_path, env, ["check", *KIMI, "--tp-size", "2", "--backend", "nccl"])
    assert run.code == 0, run.err
    t = parse_torchrun(run.argv)
    assert not t.standalone
    assert (t.nnodes, t.rdzv_backend, t.rdzv_endpoint, t.rdzv_id) == ("2", "c10d", "10.0.0.1:29400", "job-7")
    assert t.rdzv_conf == f"is_host={is_host},join_timeout=9"
    assert t.local_addr == "10.0.0.9" and t.max_restarts == 0
    # "check" spelled out is accepted; an explicit --backend after BACKEND's wins.
    c = parse_checker(t.training_script_args)
    assert c.command == "check" and c.tp_size == 2 and c.backend == "nccl"


def test_multi_node_without_endpoint_is_refused(tmp_path):
    run = run_with_fake_torchrun(tmp_path, {"NNODES": "2"}, [])
    assert run.code == 2 and run.argv == []
    assert "RDZV_ENDPOINT" in run.err and len(run.err.strip().splitlines()) == 1


def test_torchrun_sh_execs_timeout_then_torchrun():
    """exec: the bound (timeout) replaces the shell, so a CI runner's signals reach it, it forwards them
    to torchrun, and torchrun's exit code (or timeout's 124/137) is the script's."""
    assert re.search(
        r"^exec timeout --foreground --kill-after=\S+ \S+ \\\n\s+torchrun ",
        TORCHRUN_SH.read_text(),
        flags=re.M,
    )


# -- torchrun.sh bounds the whole job -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        KIMI,
        [*KIMI, "--timeout-s", "120"],
        ["check", *KIMI, "--timeout-s=7.5"],
        ["--timeout-s", "5", *KIMI, "--report", "r.json", "--timeout-s", "42"],  # the last one wins
        [*KIMI, "--timeo", "33"],  # argparse accepts an unambiguous abbreviation
        [*KIMI, "--timeout-s", "1e2"],
    ],
)
def test_job_bound_follows_the_checkers_timeout(tmp_path, args):
    """One node: torchrun is stopped JOB_SLACK_S after the --timeout-s the checker itself reads (its
    parser is the reference: last one wins, abbreviations, floats rounded up), never before it."""
    run = run_with_fake_torchrun(tmp_path, {"NPROC_PER_NODE": "2"}, args)
    assert run.code == 0, run.err
    checker_timeout_s = parse_checker(parse_torchrun(run.argv).training_script_args).timeout_s
    assert checker_timeout_s == parse_checker(args).timeout_s
    assert run.bound_s == math.ceil(checker_timeout_s) + JOB_SLACK_S, (args, run.timeout_argv)


@pytest.mark.parametrize("rdzv_conf", ["", "join_timeout=300", "read_timeout=30,join_timeout=0120"])
def test_multi_node_job_bound_covers_the_rendezvous_join(tmp_path, rdzv_conf):
    """Several nodes: the bound also covers the rendezvous' join_timeout as torch reads it from the
    --rdzv-conf that torchrun.sh passes (torch's own default when unset), so a node that arrives late but
    within join_timeout is never cut off."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    env = {"NNODES": "2", "NPROC_PER_NODE": "2", "RDZV_ENDPOINT": "10.0.0.1:29400", "RDZV_CONF": rdzv_conf}
    run = run_with_fake_torchrun(tmp_path, env, ["--timeout-s", "20"])
    assert run.code == 0, run.err
    t = parse_torchrun(run.argv)
    params = RendezvousParameters(
        backend=t.rdzv_backend,
        endpoint=t.rdzv_endpoint,
        run_id=t.rdzv_id,
        min_nodes=2,
        max_nodes=2,
        **_parse_rendezvous_config(t.rdzv_conf),
    )
    join_s = params.get_as_int("join_timeout", int(RendezvousTimeout().join.total_seconds()))
    assert run.bound_s == join_s + 20 + JOB_SLACK_S, (rdzv_conf, run.timeout_argv)


@pytest.mark.parametrize("shutdown", [None, "2", "50"])
def test_torchrun_gets_to_kill_its_workers_before_it_is_killed(tmp_path, monkeypatch, shutdown):
    """After the SIGTERM, torchrun SIGTERMs its workers and SIGKILLs them only after its shutdown timeout;
    a worker runs in its own session, so if torchrun were SIGKILLed first a stopped worker would outlive
    the job. The SIGKILL to torchrun comes later than torch's shutdown timeout (read by torch itself)."""
    from torch.distributed.launcher.api import LaunchConfig

    env = {} if shutdown is None else {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": shutdown}
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    torch_shutdown_s = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout
    run = run_with_fake_torchrun(tmp_path, env, ["--timeout-s", "5"])
    assert run.code == 0, run.err
    assert "--foreground" in run.timeout_argv  # torchrun alone is signalled; it stops its workers
    assert torch_shutdown_s + 10 <= run.kill_after_s <= torch_shutdown_s + 30, run.timeout_argv


def test_explicit_job_timeout_wins(tmp_path):
    run = run_with_fake_torchrun(tmp_path, {"JOB_TIMEOUT_S": "300"}, ["--timeout-s", "20"])
    assert run.code == 0 and run.bound_s == 300, (run.err, run.timeout_argv)


@pytest.mark.parametrize("value", ["0", "abc", "-5", "1.5", "08x", "1e3", "99999999999"])
def test_bad_job_timeout_is_refused(tmp_path, value):
    """A bound that is no bound (0 means none to GNU timeout) or not a number: one line, exit 2, no job."""
    run = run_with_fake_torchrun(tmp_path, {"JOB_TIMEOUT_S": value}, ["--timeout-s", "20"])
    assert (run.code, run.argv, run.timeout_argv) == (2, [], []), run.err
    assert "JOB_TIMEOUT_S" in run.err and len(run.err.strip().splitlines()) == 1


# -- read-verdict.sh -----------------------------------------------------------------------------------

READ_VERDICT_MAX_BYTES = 64 * 1024 * 1024
"""The largest report read-verdict.sh reads (its MAX_BYTES)."""
LARGE_WORLD = 16_384


def read_verdict(
    report: Path | str | None, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    argv = ["bash", str(READ_VERDICT)] + ([] if report is None else [str(report)])
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env={**os.environ, **(env or {})}
    )


def assert_untrusted(res: subprocess.CompletedProcess, why: str) -> None:
    """No verdict: infrastructure_failure, exit 3, and exactly one line on stderr saying why."""
    assert (res.returncode, res.stdout.strip()) == (3, "infrastructure_failure"), res
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert why in res.stderr, res.stderr


def test_every_status_is_known():
    """The statuses read-verdict.sh is held to below come from checker/status.py, model_drift included."""
    assert {"consistent", "divergent", "error", "infrastructure_failure", "model_drift"} <= set(STATUSES)


@pytest.mark.parametrize("status", STATUSES)
def test_read_verdict_exits_with_the_checkers_code(tmp_path, status):
    """read-verdict.sh maps every status to checker/status.py's exit code for it, prints the status and
    nothing on stderr."""
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"status": status, "exit_code": EXIT_CODES[status], "world_size": 2}))
    res = read_verdict(report)
    assert (res.returncode, res.stdout.strip(), res.stderr) == (EXIT_CODES[status], status, "")


@pytest.mark.parametrize("status", STATUSES)
def test_read_verdict_distrusts_an_exit_code_that_disagrees(tmp_path, status):
    """A report whose exit_code is not its status's code (every other code, a bool, a float, a string, or
    none at all) was not written by the checker as it is: no verdict, and never exit 0."""
    code = EXIT_CODES[status]
    wrong = [c for c in EXIT_CODES.values() if c != code] + [code + 10, float(code), str(code), None]
    wrong += [True] if code == 1 else [False] if code == 0 else []
    for bad in wrong:
        report = tmp_path / "report.json"
        report.write_text(json.dumps({"status": status, "exit_code": bad}))
        assert_untrusted(read_verdict(report), "exit_code")
    report.write_text(json.dumps({"status": status}))
    assert_untrusted(read_verdict(report), "exit_code")


@pytest.mark.parametrize("status", ["maybe", "CONSISTENT", " consistent", "", 0, None, ["consistent"]])
def test_read_verdict_distrusts_an_unknown_status(tmp_path, status):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"status": status, "exit_code": 0}))
    assert_untrusted(read_verdict(report), "status")


@pytest.mark.parametrize(
    "content,why",
    [
        pytest.param(
            None, "FileNotFoundError", id="missing"
        ),  # a node never joined, the launch failed: no report
        pytest.param("", "empty: a run that could not write its report", id="empty"),
        pytest.param("{not json", "not JSON", id="garbage"),
        pytest.param('{"status": "consistent", "exit_code": 0', "not JSON", id="cut-off"),
        pytest.param(b"\xff\xfe garbage", "not JSON", id="binary"),
        pytest.param("[]", "not an object", id="list"),
        pytest.param('"consistent"', "not an object", id="string"),
        pytest.param("[" * 100_000, "nested too deeply", id="deep-list"),
        pytest.param(
            '{"status": "consistent", "exit_code": 0, "ranks": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "nested too deeply",
            id="deep-inside-a-consistent-report",
        ),
        pytest.param(
            '{"status": "consistent", "exit_code": ' + "9" * 5000 + "}",
            "not JSON",
            id="int-too-long-to-convert",
        ),
    ],
)
def test_read_verdict_without_a_verdict_is_infrastructure_failure(tmp_path, content, why):
    """No report, or one that cannot be parsed (cut off, garbage, nested past the parser's recursion
    limit): exit 3, one reason, no traceback."""
    report = tmp_path / "report.json"
    if isinstance(content, bytes):
        report.write_bytes(content)
    elif content is not None:
        report.write_text(content)
    assert_untrusted(read_verdict(report), why)


def test_read_verdict_refuses_a_huge_report_without_reading_it_all(tmp_path):
    """A file over the size limit is refused even though it is a valid, consistent report: parsing it
    could exhaust memory. Just under the limit, the same report is read."""
    head = '{"status": "consistent", "exit_code": 0, "pad": "'
    report = tmp_path / "report.json"
    report.write_text(head + "x" * (READ_VERDICT_MAX_BYTES - len(head) - 2) + '"}')
    assert report.stat().st_size == READ_VERDICT_MAX_BYTES
    res = read_verdict(report)
    assert (res.returncode, res.stdout.strip()) == (0, "consistent"), res.stderr
    with report.open("a") as f:
        f.write(" ")
    assert_untrusted(read_verdict(report), "too large")


def test_read_verdict_refuses_what_is_not_a_file(tmp_path):
    """A directory, or a FIFO with no writer (an open() that would block forever): refused at once."""
    assert_untrusted(read_verdict(tmp_path), "not a regular file")
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    assert_untrusted(read_verdict(fifo), "not a regular file")


def test_read_verdict_without_python_is_infrastructure_failure(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"status": "consistent", "exit_code": 0}))
    assert_untrusted(read_verdict(report, env={"PYTHON": str(tmp_path / "no-python")}), "PYTHON")


@pytest.mark.parametrize("argv", [[], ["a.json", "b.json"]])
def test_read_verdict_usage(argv):
    """No report named (or two): a usage line and exit 2, like any other usage error; no verdict printed."""
    res = subprocess.run(
        ["bash", str(READ_VERDICT), *argv], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert (res.returncode, res.stdout) == (EXIT_CODES["error"], "")
    assert res.stderr.startswith("usage: read-verdict.sh") and len(res.stderr.strip().splitlines()) == 1


# -- recipe shapes --------------------------------------------------------------------------------------


def test_slurm_recipe_shape():
    """One agent per node, head node from scontrol, rendezvous id from the job id, verdict from report."""
    text = (LAUNCHERS / "slurm.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in text
    assert re.search(r"scontrol show hostnames \"\$SLURM_JOB_NODELIST\" \| sed -n 1p", text)
    assert re.search(r"RDZV_ID=\S*\$SLURM_JOB_ID", text)
    assert 'NODE_RANK="$SLURM_NODEID"' in text and "--kill-on-bad-exit=0" in text
    assert re.search(r"^srun .*--ntasks-per-node=1", text, flags=re.M)
    assert text.rstrip().splitlines()[-1].startswith('exec "$CHECKER_DIR/launchers/read-verdict.sh"')


def test_k8s_recipe_shape():
    """A Kubeflow PyTorchJob: one master, no restarts anywhere, NNODES = pods, NPROC_PER_NODE = GPUs."""
    yaml = yaml_or_skip()
    doc = yaml.safe_load((LAUNCHERS / "k8s-pytorchjob.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert doc["spec"]["runPolicy"]["backoffLimit"] == 0
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    pods = sum(s["replicas"] for s in specs.values())
    for spec in specs.values():
        assert spec["restartPolicy"] == "Never"
        container = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["NNODES"]["value"] == str(pods)
        assert env["NPROC_PER_NODE"]["value"] == str(container["resources"]["limits"]["nvidia.com/gpu"])
        assert env["LOCAL_ADDR"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert 'NODE_RANK="$RANK"' in container["args"][0]


def test_github_recipe_shape():
    """A CPU smoke job on a hosted runner and a self-hosted multi-GPU job; artifacts always uploaded."""
    yaml = yaml_or_skip()
    jobs = yaml.safe_load((LAUNCHERS / "github-actions.yml").read_text())["jobs"]
    runners = {name: job["runs-on"] for name, job in jobs.items()}
    assert any(isinstance(r, list) and "self-hosted" in r and "gpu" in r for r in runners.values()), runners
    assert any(r == "ubuntu-latest" for r in runners.values()), runners
    for job in jobs.values():
        uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
        assert uploads and all(s.get("if") == "always()" for s in uploads)


def test_gitlab_recipe_shape():
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "gitlab-ci.yml").read_text())["pp-capacity-preflight"]
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["reports"]["junit"].endswith("junit.xml")
    assert job["script"][-1].startswith("launchers/read-verdict.sh")


# -- every recipe bounds its job, above torchrun.sh's own bound ------------------------------------------

RECIPE_MARGIN_S = 60
"""What a recipe's own bound must leave above the node's torchrun bound: starting the step, the pod or the
srun tasks, and read-verdict.sh afterwards."""


def node_bound_s(tmp_path: Path, env: dict[str, str], invocations: list[list[str]]) -> int:
    """The longest the torchrun job on one node runs under a recipe: torchrun.sh's SIGTERM bound plus the
    SIGKILL that follows, as torchrun.sh itself computes them for the recipe's settings and arguments."""
    bounds = []
    for i, args in enumerate(invocations):
        run = run_with_fake_torchrun(tmp_path / f"inv{i}", env, completed(args))
        assert run.code == 0, run.err
        bounds.append(run.bound_s + run.kill_after_s)
    assert bounds, "no torchrun.sh invocation"
    return max(bounds)


def torchrun_invocations(text: str) -> list[list[str]]:
    return [
        a
        for line in text.splitlines()
        if "torchrun.sh" in line
        for a in checker_invocations(line + "\n", keep_passthrough=True)
    ]


def slurm_time_s(value: str) -> int:
    """sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds (sbatch(1))."""
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))
        h, m, sec = parts
        return ((int(days) * 24 + h) * 60 + m) * 60 + sec
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    h, m, sec = parts
    return (h * 60 + m) * 60 + sec


@pytest.mark.parametrize(
    "value,seconds",
    [("15", 900), ("15:30", 930), ("01:15:00", 4500), ("1-2", 93600), ("1-0:30", 88200), ("0-00:15:00", 900)],
)
def test_slurm_time_format(value, seconds):
    assert slurm_time_s(value) == seconds


def gitlab_duration_s(value: str) -> int:
    """GitLab's `timeout`: human durations such as "15m", "1h 30m", "3 hours 5 minutes"."""
    units = {"h": 3600, "m": 60, "s": 1}
    tokens = re.findall(r"(\d+)\s*([hms])[a-z]*", value)
    assert tokens and re.fullmatch(r"(\s*\d+\s*[hms][a-z]*)+\s*", value), value
    return sum(int(n) * units[u] for n, u in tokens)


def test_slurm_job_is_bounded(tmp_path):
    """--time (the allocation's backstop) outlasts every node's torchrun bound for the recipe's own
    join_timeout and --timeout-s, so read-verdict.sh still runs after a stopped worker."""
    text = (LAUNCHERS / "slurm.sbatch").read_text()
    times = re.findall(r"^#SBATCH --time=(\S+)$", text, flags=re.M)
    assert len(times) == 1, times
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", text, flags=re.M).group(1))
    rdzv_conf = re.search(r'RDZV_CONF="\$\{RDZV_CONF:-([^}]*)\}"', text).group(1)
    srun_line = next(line for line in shell_lines(text) if line.startswith("srun "))
    env = {"NNODES": str(nodes), "RDZV_ENDPOINT": "head:29400", "RDZV_CONF": rdzv_conf}
    bound = node_bound_s(tmp_path, env, torchrun_invocations(srun_line))
    assert slurm_time_s(times[0]) >= bound + RECIPE_MARGIN_S, (times[0], bound)


def test_k8s_job_is_bounded(tmp_path):
    """activeDeadlineSeconds (the operator's backstop, counted from the job's start) outlasts each pod's
    torchrun bound for the pods' own NNODES, RDZV_CONF and --timeout-s."""
    yaml = yaml_or_skip()
    doc = yaml.safe_load((LAUNCHERS / "k8s-pytorchjob.yaml").read_text())
    deadline = doc["spec"]["runPolicy"]["activeDeadlineSeconds"]
    assert isinstance(deadline, int) and deadline > 0, deadline
    for spec in doc["spec"]["pytorchReplicaSpecs"].values():
        container = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        env["RDZV_ENDPOINT"] = "master:23456"  # set by the pod's script from the operator's MASTER_ADDR
        bound = node_bound_s(tmp_path, env, torchrun_invocations(container["args"][0]))
        assert deadline >= bound + RECIPE_MARGIN_S, (deadline, bound)


def test_github_jobs_are_bounded(tmp_path):
    """Every job has timeout-minutes; the preflight step has its own, above torchrun.sh's bound for the
    step's --timeout-s (so read-verdict.sh in the same step still runs), and within the job's."""
    yaml = yaml_or_skip()
    jobs = yaml.safe_load((LAUNCHERS / "github-actions.yml").read_text())["jobs"]
    for name, job in jobs.items():
        assert isinstance(job.get("timeout-minutes"), int), f"{name}: no timeout-minutes"
        for step in job["steps"]:
            if "torchrun.sh" not in step.get("run", ""):
                continue
            minutes = step.get("timeout-minutes")
            assert isinstance(minutes, int), f"{name}: the preflight step has no timeout-minutes"
            bound = node_bound_s(tmp_path / name, {}, torchrun_invocations(step["run"]))
            assert minutes * 60 >= bound + RECIPE_MARGIN_S, (name, minutes, bound)
            assert minutes <= job["timeout-minutes"], name


def test_gitlab_job_is_bounded(tmp_path):
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "gitlab-ci.yml").read_text())["pp-capacity-preflight"]
    env = {k: str(v) for k, v in job["variables"].items()}
    bound = node_bound_s(tmp_path, env, torchrun_invocations("\n".join(job["script"])))
    assert gitlab_duration_s(job["timeout"]) >= bound + RECIPE_MARGIN_S, (job["timeout"], bound)


# -- a stopped worker cannot hold the runner: torchrun.sh's bound ends it, for real -------------------------


def _tagged_workers(tag: str) -> dict[int, str]:
    """pid -> state of every live checker worker started with ``PPCK_TEST_TAG=tag`` (torchrun's workers
    carry RANK; torchrun itself and timeout do not)."""
    found = {}
    needle = f"PPCK_TEST_TAG={tag}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and any(v.startswith(b"RANK=") for v in env) and state not in ("Z", "X"):
            found[int(entry.name)] = state
    return found


@pytest.mark.faults
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc to find the workers")
def test_stopped_workers_end_at_the_job_bound(tmp_path):
    """Both ranks SIGSTOPped as soon as they start: nothing inside the checker can end them, and torchrun
    alone would wait forever. torchrun.sh's bound (JOB_TIMEOUT_S) SIGTERMs torchrun, which SIGKILLs its
    stopped workers after its shutdown timeout: the script exits with timeout's 124 in bounded time, no
    worker survives, and the verdict read afterwards is infrastructure_failure."""
    if REAL_TIMEOUT is None:
        pytest.skip("no `timeout` command (GNU coreutils)")
    job_timeout_s, shutdown_s = 10, 2
    tag = uuid.uuid4().hex
    report = tmp_path / "report.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in torchrun_knobs()
        and not k.startswith(("PET_", "SGLANG_", "TORCHELASTIC_", "TORCH_ELASTIC_"))
    }
    env.update(
        NPROC_PER_NODE="2",
        BACKEND="gloo",
        JOB_TIMEOUT_S=str(job_timeout_s),
        PPCK_TEST_TAG=tag,
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT=str(shutdown_s),
        OMP_NUM_THREADS="1",
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    log = tmp_path / "torchrun.log"
    stopped: set[int] = set()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(TORCHRUN_SH), *KIMI, "--timeout-s", "60", "--report", str(report)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = time.monotonic()
    try:
        while proc.poll() is None and len(stopped) < 2 and time.monotonic() - started < job_timeout_s:
            for pid in _tagged_workers(tag).keys() - stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
            time.sleep(0.05)
        stop_done = time.monotonic() - started
        try:
            code = proc.wait(timeout=job_timeout_s + shutdown_s + 30)
        except subprocess.TimeoutExpired:
            code = None
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + 5
        while _tagged_workers(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = _tagged_workers(tag)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in _tagged_workers(tag):  # only this test's own workers, found by their unique tag
            os.kill(pid, signal.SIGKILL)
    output = log.read_text(errors="replace")[-3000:]
    assert len(stopped) == 2 and stop_done < job_timeout_s, (stopped, stop_done, output)
    assert code == 124, (code, output)  # GNU timeout: the command timed out (and ended on SIGTERM)
    assert job_timeout_s <= elapsed < job_timeout_s + shutdown_s + 10, (elapsed, output)
    assert survivors == {}, survivors
    res = read_verdict(report)
    assert (res.returncode, res.stdout.strip()) == (3, "infrastructure_failure"), res


# -- the CPU smoke recipe, run for real -----------------------------------------------------------------


@pytest.mark.slow
def test_github_cpu_smoke_step_runs(tmp_path):
    """The CPU smoke job's preflight step, run as GitHub runs it (bash -eo pipefail) from the checkout:
    two real ranks under torchrun --standalone, verdict read from the report, report + JUnit written."""
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "github-actions.yml").read_text())["jobs"]["cpu-smoke"]
    step = next(s["run"] for s in job["steps"] if "torchrun.sh" in s.get("run", ""))
    out = tmp_path / "out"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in torchrun_knobs() and not k.startswith(("PET_", "SGLANG_", "TORCHELASTIC_"))
    }
    env.update(OUT=str(out), OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    env.pop("GITHUB_STEP_SUMMARY", None)
    res = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "consistent"
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "consistent"
    assert (out / "junit.xml").exists()
    # read-verdict.sh's size limit fits a real report for a large job: this one's rank rows repeated for
    # LARGE_WORLD ranks (a 16,384-GPU world), written as the checker writes them, stay readable.
    assert len(report["ranks"]) == 2
    big = dict(
        report,
        world_size=LARGE_WORLD,
        ranks=[dict(report["ranks"][i % 2], rank=i) for i in range(LARGE_WORLD)],
    )
    big_path = tmp_path / "big.json"
    big_path.write_text(json.dumps(big, indent=2))
    res = read_verdict(big_path)
    assert (res.returncode, res.stdout.strip()) == (0, "consistent"), (big_path.stat().st_size, res.stderr)


@pytest.mark.slow
def test_torchrun_sh_with_a_launch_command_runs(tmp_path):
    """One node, two real gloo ranks: torchrun.sh with a budget before ``--`` and the deployment's launch
    command after it (a model directory holding Qwen3.5-397B-A17B's config.json, pp 2, a request cap,
    and flags sizing ignores). Both ranks read the same command: consistent, the report records what the
    command set, and read-verdict.sh says so. The values are the ones the same deployment spelled in the
    checker's own flags derives (an independent path: no launch command)."""
    model = tmp_path / "Qwen3.5-397B-A17B"
    model.mkdir()
    shutil.copy(FIXTURES / "qwen3_5_397b_a17b.json", model / "config.json")
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    launch = [*SERVE, "--model-path", str(model), "--pp-size", "2", "--max-running-requests", "64"]
    launch += ["--host", "0.0.0.0", "--port", "30000", "--trust-remote-code"]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in torchrun_knobs() and not k.startswith(("PET_", "SGLANG_", "TORCHELASTIC_"))
    }
    env.update(
        NPROC_PER_NODE="2",
        BACKEND="gloo",
        OMP_NUM_THREADS="1",
        JOB_TIMEOUT_S="150",
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    env.pop("GITHUB_STEP_SUMMARY", None)
    res = subprocess.run(
        ["bash", str(TORCHRUN_SH), "--budget-gib", "40", "--timeout-s", "60", "--report", str(report)]
        + ["--", *launch],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["status"] == "consistent" and rep["world_size"] == 2, rep.get("errors")
    launch_input = rep["inputs"]["launch_command"]
    # The flags that size nothing (--host, --port) are accepted and left out of the recorded inputs; the
    # sizing flags are compared as their own inputs, so the launch_command input is the form alone.
    assert launch_input == "python -m sglang.launch_server", launch_input
    assert rep["inputs"]["max_running_requests"] == 64, rep["inputs"]
    assert "30000" not in launch_input and "0.0.0.0" not in launch_input, launch_input
    by_hand = subprocess.run(
        [sys.executable, "-m", "checker", "derive", "--budget-gib", "40", "--format", "json"]
        + ["--model-config", str(model), "--pp-size", "2", "--max-running-requests", "64"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert by_hand.returncode == 0, by_hand.stderr
    values = ("max_mamba_cache_size", "max_running_requests")
    expected = {tuple(r[k] for k in values) for r in json.loads(by_hand.stdout)["ranks"]}
    assert {tuple(r[k] for k in values) for r in rep["ranks"]} == expected, (rep["ranks"], expected)
    res = read_verdict(report)
    assert (res.returncode, res.stdout.strip()) == (0, "consistent"), res.stderr
