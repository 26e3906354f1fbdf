"""The launch recipes in launchers/: every checker command line in them is accepted by the checker's own
parser, the torchrun line they build is accepted by torchrun's, and the CPU smoke recipe really runs.

A recipe nobody runs rots: a renamed flag, a knob spelled differently in one recipe, a torchrun option
that moved. These tests read the recipes as text and YAML, so they fail the moment one drifts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = REPO_ROOT / "launchers"
TORCHRUN_SH = LAUNCHERS / "torchrun.sh"
READ_VERDICT = LAUNCHERS / "read-verdict.sh"
RECIPES = ["torchrun.sh", "read-verdict.sh", "slurm.sbatch", "k8s-pytorchjob.yaml", "github-actions.yml",
           "gitlab-ci.yml"]
SHELL_SCRIPTS = ["torchrun.sh", "read-verdict.sh", "slurm.sbatch"]
KNOB_NAMES = re.compile(r"\b(NNODES|NPROC\w*|NODE_RANK|RDZV_\w+|LOCAL_ADDR|BACKEND)\b")
# Variables a recipe may define for itself on top of torchrun.sh's knobs.
OWN_VARIABLES = {"slurm.sbatch": {"RDZV_PORT"}}
SUBPROCESS_TIMEOUT_S = 60


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


def checker_invocations(text: str) -> list[list[str]]:
    """The checker arguments of every ``.../torchrun.sh ARGS`` (or ``slurm.sbatch ARGS``) command line."""
    found = []
    for line in shell_lines(text):
        if not any(script in line for script in LAUNCHER_SCRIPTS):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        try:
            tokens = list(lexer)
        except ValueError:  # prose with an apostrophe, not a command
            continue
        starts = [i for i, t in enumerate(tokens) if t.endswith(LAUNCHER_SCRIPTS)]
        for start in starts:
            args = []
            for tok in tokens[start + 1:]:
                if tok and set(tok) <= set("|&;<>()"):
                    break  # a shell operator ends the command
                if tok.startswith("#"):
                    break  # a trailing comment
                if tok not in ("$@", "..."):  # "$@": the script's own arguments; "...": elided
                    args.append(expand(tok))
            found.append(args)
    return found


def fenced_code(markdown: str) -> str:
    return "\n".join(re.findall(r"```[a-z]*\n(.*?)```", markdown, flags=re.S))


def parse_checker(args: list[str]):
    """The checker's own parser, as ``torchrun -m checker`` runs it: exit 2 and a line on stderr on error."""
    from checker.cli import build_parser, with_default_command

    return build_parser().parse_args(with_default_command(args))


def torchrun_knobs() -> set[str]:
    return set(re.findall(r'^([A-Z_]+)="\$\{\1:-', TORCHRUN_SH.read_text(), flags=re.M))


# -- every recipe ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RECIPES)
def test_checker_commands_in_recipe_parse(name, capsys):
    """Each recipe launches the checker at least once, and the checker's parser accepts every
    invocation; a renamed or removed flag shows here as the recipe's name and argparse's message."""
    invocations = checker_invocations((LAUNCHERS / name).read_text())
    assert invocations, f"{name}: no launchers/torchrun.sh or slurm.sbatch command line found"
    for args in invocations:
        try:
            ns = parse_checker(args)
        except SystemExit as exc:
            pytest.fail(f"{name}: checker rejects {shlex.join(args)}: {capsys.readouterr().err.strip()} "
                        f"(exit {exc.code})")
        assert ns.command == "check"


def test_readme_commands_parse(capsys):
    """The README's code blocks, once the multi-node section is in: same rule as the recipes."""
    readme = REPO_ROOT / "README.md"
    invocations = checker_invocations(fenced_code(readme.read_text())) if readme.exists() else []
    if not invocations:
        pytest.skip("README.md shows no launchers/torchrun.sh command yet")
    for args in invocations:
        try:
            parse_checker(args)
        except SystemExit:
            pytest.fail(f"README.md: checker rejects {shlex.join(args)}: {capsys.readouterr().err.strip()}")


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_use_only_known_knobs(name):
    """A knob spelled differently in a recipe (NPROC=8, RDZV_ENDPOINTS=...) would be silently ignored."""
    known = torchrun_knobs() | OWN_VARIABLES.get(name, set())
    assert {"NNODES", "NPROC_PER_NODE", "NODE_RANK", "RDZV_ENDPOINT", "RDZV_ID", "LOCAL_ADDR",
            "BACKEND"} <= known
    used = set(KNOB_NAMES.findall((LAUNCHERS / name).read_text()))
    assert used <= known, f"{name} uses unknown knobs {sorted(used - known)}"


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_shell_scripts_are_valid_bash(name):
    res = subprocess.run(["bash", "-n", str(LAUNCHERS / name)], capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT_S)
    assert res.returncode == 0, res.stderr


def _yaml_shell_blocks(name: str) -> list[str]:
    """The shell each CI/Kubernetes recipe hands to bash: GitHub ``run``, GitLab ``script``, pod args."""
    yaml = yaml_or_skip()
    doc = yaml.safe_load((LAUNCHERS / name).read_text())
    if name == "github-actions.yml":
        return [s["run"] for job in doc["jobs"].values() for s in job["steps"] if "run" in s]
    if name == "gitlab-ci.yml":
        return ["\n".join(job["script"]) for job in doc.values() if isinstance(job, dict) and "script" in job]
    return [spec["template"]["spec"]["containers"][0]["args"][0]
            for spec in doc["spec"]["pytorchReplicaSpecs"].values()]


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml", "k8s-pytorchjob.yaml"])
def test_embedded_shell_is_valid_bash(name):
    """The shell inside YAML recipes parses (bash -n), and each runs the checker and reads its verdict."""
    blocks = _yaml_shell_blocks(name)
    assert blocks
    for block in blocks:
        res = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True,
                             timeout=SUBPROCESS_TIMEOUT_S)
        assert res.returncode == 0, f"{name}: {res.stderr}\n{block}"
    launching = [b for b in blocks if "torchrun.sh" in b]
    assert launching and all("read-verdict.sh" in b for b in launching), launching


# -- torchrun.sh builds a torchrun command line torchrun accepts ----------------------------------------


def run_with_fake_torchrun(
    tmp_path: Path, env: dict[str, str], args: list[str]
) -> tuple[int, list[str], str]:
    """Run torchrun.sh with a stand-in ``torchrun`` on PATH that records its argv (NUL-separated)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/sh\nprintf \'%s\\0\' "$@" > "$ARGV_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "argv"
    out.unlink(missing_ok=True)
    clean = {k: v for k, v in os.environ.items()
             if k not in torchrun_knobs() and not k.startswith(("PET_", "SGLANG_"))}
    full = {**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_OUT": str(out), **env}
    res = subprocess.run(["bash", str(TORCHRUN_SH), *args], env=full, capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT_S)
    argv = out.read_bytes().decode().split("\0")[:-1] if out.exists() else []
    return res.returncode, argv, res.stderr


def parse_torchrun(argv: list[str]):
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


def test_single_node_is_standalone(tmp_path):
    """NNODES=1 (the default): --standalone, no endpoint; every argument reaches the checker verbatim."""
    code, argv, err = run_with_fake_torchrun(
        tmp_path, {"NPROC_PER_NODE": "4"}, ["--model", "kimi-k3", "--report", "dir with space/r.json"])
    assert code == 0, err
    t = parse_torchrun(argv)
    assert t.standalone and t.nproc_per_node == "4" and t.max_restarts == 0
    assert t.module and t.training_script == "checker"
    c = parse_checker(t.training_script_args)
    assert c.command == "check" and c.backend == "auto" and c.model == "kimi-k3"
    assert c.report == "dir with space/r.json"


@pytest.mark.parametrize("node_rank,is_host", [("0", "1"), ("1", "0")])
def test_multi_node_uses_c10d_with_explicit_host_and_local_addr(tmp_path, node_rank, is_host):
    """NNODES=2: c10d rendezvous at RDZV_ENDPOINT; node 0 hosts the store (is_host=1) and the others do
    not, whatever their hostnames; LOCAL_ADDR becomes --local-addr; RDZV_CONF is appended."""
    env = {"NNODES": "2", "NPROC_PER_NODE": "2", "NODE_RANK": node_rank, "RDZV_ENDPOINT": "10.0.0.1:29400",
           "RDZV_ID": "job-7", "LOCAL_ADDR": "10.0.0.9", "BACKEND": "gloo", "RDZV_CONF": "join_timeout=9"}
    code, argv, err = run_with_fake_torchrun(tmp_path, env, ["check", "--tp-size", "2", "--backend", "nccl"])
    assert code == 0, err
    t = parse_torchrun(argv)
    assert not t.standalone
    assert (t.nnodes, t.rdzv_backend, t.rdzv_endpoint, t.rdzv_id) == ("2", "c10d", "10.0.0.1:29400", "job-7")
    assert t.rdzv_conf == f"is_host={is_host},join_timeout=9"
    assert t.local_addr == "10.0.0.9" and t.max_restarts == 0
    # "check" spelled out is accepted; an explicit --backend after BACKEND's wins.
    c = parse_checker(t.training_script_args)
    assert c.command == "check" and c.tp_size == 2 and c.backend == "nccl"


def test_multi_node_without_endpoint_is_refused(tmp_path):
    code, argv, err = run_with_fake_torchrun(tmp_path, {"NNODES": "2"}, [])
    assert code == 2 and argv == []
    assert "RDZV_ENDPOINT" in err and len(err.strip().splitlines()) == 1


def test_torchrun_sh_execs_torchrun():
    """exec: torchrun replaces the shell, so a CI runner's signals reach it and its exit code is ours."""
    assert re.search(r"^exec torchrun ", TORCHRUN_SH.read_text(), flags=re.M)


# -- read-verdict.sh -----------------------------------------------------------------------------------


@pytest.mark.parametrize("status,code", [("consistent", 0), ("divergent", 1), ("error", 2),
                                         ("infrastructure_failure", 3)])
def test_read_verdict_exits_with_the_status_code(tmp_path, status, code):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"status": status, "world_size": 2}))
    res = subprocess.run(["bash", str(READ_VERDICT), str(report)], capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT_S)
    assert (res.returncode, res.stdout.strip()) == (code, status)


@pytest.mark.parametrize("content", [None, "", "{not json", "[]", '{"status": "maybe"}'])
def test_read_verdict_without_a_verdict_is_infrastructure_failure(tmp_path, content):
    """No report (a node never joined, the launch failed) or an unreadable one: exit 3, one reason."""
    report = tmp_path / "report.json"
    if content is not None:
        report.write_text(content)
    res = subprocess.run(["bash", str(READ_VERDICT), str(report)], capture_output=True, text=True,
                         timeout=SUBPROCESS_TIMEOUT_S)
    assert (res.returncode, res.stdout.strip()) == (3, "infrastructure_failure")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


# -- recipe shapes --------------------------------------------------------------------------------------


def test_slurm_recipe_shape():
    """One agent per node, head node from scontrol, rendezvous id from the job id, verdict from report."""
    text = (LAUNCHERS / "slurm.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in text
    assert re.search(r"scontrol show hostnames \"\$SLURM_JOB_NODELIST\" \| sed -n 1p", text)
    assert re.search(r"RDZV_ID=\S*\$SLURM_JOB_ID", text)
    assert "NODE_RANK=\"$SLURM_NODEID\"" in text and "--kill-on-bad-exit=0" in text
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


# -- the CPU smoke recipe, run for real -----------------------------------------------------------------


def test_github_cpu_smoke_step_runs(tmp_path):
    """The CPU smoke job's preflight step, run as GitHub runs it (bash -eo pipefail) from the checkout:
    two real ranks under torchrun --standalone, verdict read from the report, report + JUnit written."""
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "github-actions.yml").read_text())["jobs"]["cpu-smoke"]
    step = next(s["run"] for s in job["steps"] if "torchrun.sh" in s.get("run", ""))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items()
           if k not in torchrun_knobs() and not k.startswith(("PET_", "SGLANG_", "TORCHELASTIC_"))}
    env.update(OUT=str(out), OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    env.pop("GITHUB_STEP_SUMMARY", None)
    res = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "consistent"
    assert json.loads((out / "report.json").read_text())["status"] == "consistent"
    assert (out / "junit.xml").exists()
