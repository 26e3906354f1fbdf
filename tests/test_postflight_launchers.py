"""The post-flight step of every recipe in launchers/, run: once the server reports ready, its own log is
held to the preflight's prediction.

What stands in for what this machine lacks: the server is a script that writes a log rendered from
SGLang's own format strings (tests/postflight_logs.py) for the preflight's report, then says it is ready
(a file that a ``curl`` stand-in on PATH checks: no port is opened) and waits to be killed; ``kubectl``,
``scontrol`` and ``squeue`` are stand-ins printing what a cluster would. Everything else is the recipe's
own shell and ``launchers/postflight.sh``, which runs the real ``python -m checker postflight``. What a
user relies on: the step passes (0) when the server started as predicted, fails (1) naming the rank when
it did not, and a server that never gets ready ends the wait in bounded time (3).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from postflight_logs import ServerLog, preflight_report

REPO_ROOT = Path(__file__).resolve().parent.parent
LAUNCHERS = REPO_ROOT / "launchers"
POSTFLIGHT_SH = LAUNCHERS / "postflight.sh"
TIMEOUT_S = 60

FAKE_SERVER = """\
import os, pathlib, sys, time
sys.stdout.write(pathlib.Path(os.environ["FAKE_LOG"]).read_text())
sys.stdout.flush()
pathlib.Path(os.environ["FAKE_READY"]).touch()
time.sleep(float(os.environ.get("FAKE_SERVE_S", "120")))
"""
FAKE_CURL = '#!/usr/bin/env bash\n[[ -f "$FAKE_READY" ]]\n'


def yaml_or_skip():
    return pytest.importorskip("yaml", reason="PyYAML reads the CI and Kubernetes recipes")


@pytest.fixture
def world(tmp_path):
    """A preflight report of pp 2 x tp 2, a server log that answers it, stand-ins on PATH, an env."""
    report = preflight_report(4, sizing={"tp_size": 2})
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(report))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(FAKE_CURL)
    (bin_dir / "curl").chmod(0o755)
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "GITHUB_"))}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        PYTHONPATH=str(REPO_ROOT),
        OUT=str(out),
        FAKE_READY=str(tmp_path / "ready"),
        FAKE_LOG=str(tmp_path / "served.log"),
        SGLANG_LAUNCH=f"{sys.executable} {tmp_path / 'fake_server.py'}",
    )

    def serve(override: dict | None = None) -> None:
        """What the server will log: as predicted, or with ``override`` (rank -> values)."""
        (tmp_path / "served.log").write_text(ServerLog(report, override=override or {}).text())

    serve()
    return {"report": report, "out": out, "env": env, "bin": bin_dir, "serve": serve, "tmp": tmp_path}


def bash(script: str, env: dict[str, str], *, timeout: float = TIMEOUT_S, args: list[str] | None = None):
    """As GitHub and GitLab run a step: bash -e -o pipefail, from the checkout."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script, "bash", *(args or [])],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_postflight_sh_is_valid_bash():
    res = subprocess.run(
        ["bash", "-n", str(POSTFLIGHT_SH)], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.slow  # seconds of the recipe's own waits for a server: in the slow step
def test_postflight_sh_waits_for_ready_then_gives_the_checkers_verdict(world):
    """The server gets ready 1 s after the script starts waiting: the verdict comes after, with its JSON
    report and JUnit file beside the preflight's report."""
    env, out = world["env"], world["out"]
    (out / "server.log").write_text(ServerLog(world["report"]).text())
    later = subprocess.Popen(["bash", "-c", f"sleep 1; touch {env['FAKE_READY']}"])
    try:
        t0 = time.monotonic()
        res = subprocess.run(
            ["bash", str(POSTFLIGHT_SH), str(out / "report.json"), str(out / "server.log")],
            env={**env, "READY_URL": "http://127.0.0.1:1/health", "READY_TIMEOUT_S": "30"},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        waited = time.monotonic() - t0
    finally:
        later.wait(timeout=10)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    assert waited >= 1 and "verdict: consistent (exit 0)" in res.stdout
    assert json.loads((out / "postflight.json").read_text())["status"] == "consistent"
    assert (out / "postflight.xml").read_text().startswith("<?xml")


@pytest.mark.slow  # seconds of the recipe's own bounded waits: in the slow step
@pytest.mark.parametrize("how", ["server-exits", "never-ready"])
def test_a_server_that_never_gets_ready_ends_the_wait_in_bounded_time(world, how):
    env, out = world["env"], world["out"]
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    extra = {"SERVER_PID": str(gone.pid)} if how == "server-exits" else {"READY_TIMEOUT_S": "1"}
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(POSTFLIGHT_SH), str(out / "report.json"), str(out / "server.log")],
        env={**env, "READY_URL": "http://127.0.0.1:1/health", **extra},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert res.returncode == 3 and res.stdout.strip() == "infrastructure_failure", res
    (line,) = res.stderr.strip().splitlines()
    assert ("exited before" in line) if how == "server-exits" else ("did not answer within 1 s" in line)
    assert time.monotonic() - t0 < 15


def _github_serve_step() -> str:
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "github-actions.yml").read_text())["jobs"]["gpu-preflight"]
    return next(s["run"] for s in job["steps"] if "postflight.sh" in s.get("run", ""))


def _gitlab_postflight_job() -> str:
    yaml = yaml_or_skip()
    job = yaml.safe_load((LAUNCHERS / "gitlab-ci.yml").read_text())["pp-capacity-postflight"]
    assert job["needs"] == ["pp-capacity-preflight"] and job["artifacts"]["reports"]["junit"].endswith(
        "postflight.xml"
    )
    return "\n".join(job["script"])


@pytest.mark.slow  # seconds each: a server start, waits of the recipe's own (GitHub's loop sleeps 5 s)
@pytest.mark.parametrize("recipe", ["github-actions", "gitlab-ci"])
def test_the_ci_recipes_serve_step_holds_the_server_to_the_prediction(world, recipe):
    """The recipe's own step, as the CI system runs it: the server started in the background, ready, its
    log held to the preflight's report: 0 as predicted; 1 when one rank's pool differs, naming it; the
    server stopped either way (the step's trap)."""
    script = _github_serve_step() if recipe == "github-actions" else _gitlab_postflight_job()
    env = dict(world["env"])
    res = bash(script, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "checker postflight: CONSISTENT" in res.stdout
    doc = json.loads((world["out"] / "postflight.json").read_text())
    assert doc["status"] == "consistent" and len(doc["ranks"]) == 4
    world["serve"]({3: {"max_mamba_cache_size": 5}})
    os.unlink(env["FAKE_READY"])
    res = bash(script, env)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-2000:]
    assert "3     PP1 TP1" in res.stdout and "max_mamba_cache_size" in res.stdout
    leftover = subprocess.run(
        ["pgrep", "-f", str(world["tmp"] / "fake_server.py")], capture_output=True, text=True
    )
    assert leftover.stdout.strip() == "", "the step left its server running"


def _usage_lines(path: Path, start: str) -> str:
    """The comment lines of a recipe's header from the one containing ``start`` to the postflight.sh
    line, as a user pastes them (the leading ``#`` and indentation taken off)."""
    lines = [re.sub(r"^#\s{1,4}", "", line) for line in path.read_text().splitlines() if line.startswith("#")]
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next(i for i in range(first, len(lines)) if "launchers/postflight.sh" in lines[i])
    return "\n".join(lines[first : last + 1])


def test_torchrun_sh_usage_post_flight_line_runs(world):
    """torchrun.sh's usage: ``launchers/postflight.sh r.json server.log`` once the server is ready."""
    text = _usage_lines(LAUNCHERS / "torchrun.sh", "launchers/postflight.sh")
    (line,) = [x.split("#")[0].strip() for x in text.splitlines() if "postflight.sh" in x]
    tmp = world["tmp"]
    (tmp / "r.json").write_text(json.dumps(world["report"]))
    (tmp / "server.log").write_text(ServerLog(world["report"]).text())
    res = subprocess.run(
        ["bash", "-c", f"cd {tmp} && {REPO_ROOT}/{line}"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr


def test_slurm_sbatch_usage_post_flight_runs(world):
    """slurm.sbatch's usage, from the submit directory: the serving job's head node from ``squeue`` and
    ``scontrol`` (stand-ins), every node's serve log held to the preflight job's report."""
    tmp, report = world["tmp"], world["report"]
    (tmp / "pp-capacity-preflight-11").mkdir()
    (tmp / "pp-capacity-preflight-11" / "report.json").write_text(json.dumps(report))
    log = ServerLog(report)
    for node in range(2):  # serve-%j-%n.log: one per node
        (tmp / f"serve-12-{node}.log").write_text(log.text(ranks=[2 * node, 2 * node + 1]))
    (world["bin"] / "squeue").write_text('#!/usr/bin/env bash\necho "gpu[01-02]"\n')
    (world["bin"] / "scontrol").write_text('#!/usr/bin/env bash\nprintf "gpu01\\ngpu02\\n"\n')
    for name in ("squeue", "scontrol"):
        (world["bin"] / name).chmod(0o755)
    Path(world["env"]["FAKE_READY"]).touch()
    script = _usage_lines(LAUNCHERS / "slurm.sbatch", 'READY_URL="http://').replace(
        "launchers/", f"{REPO_ROOT}/launchers/"
    )
    env = {**world["env"], "SERVE_JOB_ID": "12", "PREFLIGHT_JOB_ID": "11"}
    res = subprocess.run(
        ["bash", "-c", f"cd {tmp} && {script}"], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    doc = json.loads((tmp / "pp-capacity-preflight-11" / "postflight.json").read_text())
    assert doc["inputs"]["logs"] == ["serve-12-0.log", "serve-12-1.log"] and doc["status"] == "consistent"


def test_kubernetes_usage_post_flight_runs(world):
    """k8s-pytorchjob.yaml's usage: the report fished out of the pod that printed it, the serving pods'
    logs (``kubectl logs --prefix``: ``[pod/NAME/CONTAINER]`` before each line) piped in."""
    tmp, report = world["tmp"], world["report"]
    pods = tmp / "pods"
    pods.mkdir()
    (pods / "master-0").write_text(
        "checker: CONSISTENT - ...\n" + json.dumps(report, indent=2) + "\nconsistent\n"
    )
    (pods / "worker-0").write_text("checker: CONSISTENT - ... (rank 2 of 4)\n")
    served = ServerLog(report).text().splitlines()
    (pods / "sglang").write_text(
        "".join(f"[pod/sglang-{i % 2}/sglang] {line}\n" for i, line in enumerate(served))
    )
    kubectl = f"""#!/usr/bin/env bash
case "$1 $2" in
  "get pods") echo pod/pp-capacity-preflight-master-0; echo pod/pp-capacity-preflight-worker-0 ;;
  "wait --for=condition=Ready") exit 0 ;;
  "logs pod/pp-capacity-preflight-master-0") cat {pods}/master-0 ;;
  "logs pod/pp-capacity-preflight-worker-0") cat {pods}/worker-0 ;;
  "logs -l") cat {pods}/sglang ;;
  *) echo "kubectl stand-in: $*" >&2; exit 9 ;;
esac
"""
    (world["bin"] / "kubectl").write_text(kubectl)
    (world["bin"] / "kubectl").chmod(0o755)
    script = _usage_lines(LAUNCHERS / "k8s-pytorchjob.yaml", "for pod in $(kubectl get pods").replace(
        "launchers/", f"{REPO_ROOT}/launchers/"
    )
    res = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", f"cd {tmp} && {script}"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    assert json.loads((tmp / "preflight.json").read_text()) == report
    doc = json.loads((tmp / "postflight.json").read_text())
    assert doc["status"] == "consistent" and doc["inputs"]["logs"] == ["<stdin>"] and len(doc["ranks"]) == 4
