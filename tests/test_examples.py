"""Every example a user copies runs as printed: README.md, docs/*.md, launchers/* and every ``--help``.

How an example is run here:

1. **Extracted.** Markdown: fenced shell blocks, the ``$`` lines of transcripts, indented code blocks and
   inline code spans that start with a checker command and give a flag. Shell recipes: their usage
   comments. YAML recipes: every GitHub ``run`` step, GitLab ``script`` and pod ``args``, with the
   variables the recipe defines for it. ``--help``: the ``examples:`` of the top-level help and of every
   command, as the parser renders them.
2. **Run by bash, as printed**, from a work directory laid out as a checkout (``examples/``,
   ``launchers/``), with stand-ins on ``PATH`` for what this machine cannot run (``torchrun``,
   ``python -m checker``, ``sbatch``/``srun``/``scontrol``, ``nvidia-smi``, ``kubectl``, ``pip``,
   ``pytest``, a server start). The stand-ins record what they were asked to run: argv, working directory,
   environment. Everything else in the example is the real thing: ``launchers/torchrun.sh``,
   ``launchers/slurm.sbatch``, ``rm``, ``mkdir``, ``$(...)``, the recipe's variables.
3. **Every recorded checker command runs in this process**, through :func:`checker.cli.main.main`:
   ``derive``, ``plan`` and ``sweep`` as they are; under torchrun, on torchrun's own world
   (``--nnodes`` x ``--nproc-per-node``, read as torch's own parser reads them). Every rank of that world
   runs check's own job
   (:class:`checker.commands.check_job.CheckJob`: local facts, row, verdict, report) in the run protocol's
   order, the rows handed over in this process instead of over a process group, so the layout, model,
   release and flags are those of the printed command at its printed size. (A check of one rank with
   ``--allow-single-rank`` cannot stand in for it: a pp 2 x tp 4 launch command is refused on a world of
   one rank.)
4. **Judged**: exit 0 unless :data:`EXPECTED_EXIT` says otherwise, every checker command of the example
   reached, and no deployment that SGLang stops at start-up: a model class that asserts a single stage,
   or crashes on a later one, at ``pp_size`` > 1 (:data:`SINGLE_STAGE_ONLY`, read from SGLang 0.5.23's
   code, checked here whatever the checker itself says).

What stands in for what this machine lacks is in tables, visibly: :data:`PATH_MAP` (where the examples'
paths point here), :data:`CI_ENV` and the Kubernetes tables (what a CI system, a cluster or an operator
sets), :data:`ASSUMED_DEVICE_FREE_GIB` (free GPU memory for ``--budget-from-device`` on a CPU),
:data:`NEEDS` (what needs a CUDA GPU, an installed SGLang or seconds: left out of the quick run, run as
printed by the ``slow``, ``gpu`` and ``sglang`` tests). Forms (``...``, a placeholder) are listed in
:data:`SCHEMATIC`, lines that only name a command in :data:`PROSE`; what is deliberately not run (a
server start, an install, the test suite) is recorded, not run. :data:`INVENTORY` pins how many checker
commands each source holds, and every line that looks like a command must belong to an example or be
listed (:func:`test_every_command_line_is_extracted`), so no example slips past unrun.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MODELS = REPO_ROOT / "examples" / "models"
MARKDOWN = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO_ROOT / "docs").glob("*.md"))]
SHELL_RECIPES = ["launchers/torchrun.sh", "launchers/read-verdict.sh", "launchers/slurm.sbatch"]
YAML_RECIPES = ["launchers/github-actions.yml", "launchers/gitlab-ci.yml", "launchers/k8s-pytorchjob.yaml"]
BASH_TIMEOUT_S = 60
END_TO_END_TIMEOUT_S = 300

# ---- what stands in for what this machine does not have (the tables the module docstring names) --------

PATH_MAP: list[tuple[str, str, str]] = [
    (
        r"(?<![\w./-])/(?:shared/)?models/",
        "examples/models/",
        "a deployment's model directory on its nodes (/models/NAME, /shared/models/NAME): the checker reads "
        "only its config.json, which examples/models/NAME ships",
    ),
    (r"(?<![\w./-])/shared/out/", "{work}/shared/out/", "storage every node shares: the work directory"),
    (
        r"(?<![\w./-])/tmp/pp-capacity-preflight\b",
        "{work}/pp-capacity-preflight",
        "the pod's scratch directory: the work directory (tests run side by side)",
    ),
]
"""(pattern, replacement, why): applied to an example's text and its recipe's variables before bash runs
it. Nothing else is rewritten."""

CI_ENV = {
    "CI_JOB_ID": "4242",  # GitLab's job id (README's multi-node RDZV_ID, launchers/gitlab-ci.yml)
    "i": "0",  # launchers/torchrun.sh's usage: NODE_RANK=$i, this node's index
}
"""Variables a CI system or the user's shell sets, as the examples expect them."""

K8S_POD_ENV = {
    # What the Kubeflow operator sets in each pod: its node index and the master's service.
    "Master": {"RANK": "0", "MASTER_ADDR": "pp-capacity-preflight-master-0", "MASTER_PORT": "23456"},
    "Worker": {"RANK": "1", "MASTER_ADDR": "pp-capacity-preflight-master-0", "MASTER_PORT": "23456"},
}
K8S_FIELD_REFS = {
    "metadata.labels['training.kubeflow.org/job-name']": "pp-capacity-preflight",
    "status.podIP": "10.0.0.2",
}
"""What a pod's ``valueFrom.fieldRef`` entries resolve to."""

GPUS_ON_A_NODE = 8
"""``nvidia-smi --list-gpus`` on the GPU runner the recipes describe (8 GPUs = pp 2 x tp 4)."""

ASSUMED_DEVICE_FREE_GIB = "139"
"""``--budget-from-device`` on this CPU machine: the free memory of an idle H200 (the figure the docs give
``plan --gpu-free-gib``), passed as ``--device-free-gib`` before ``--``."""


@dataclass(frozen=True)
class Need:
    need: str
    """cuda (a CUDA GPU), sglang (SGLang importable), slow (seconds of work: the slow group)."""
    when: str
    """A regex over the checker's own flags (before ``--``)."""
    flags: tuple[tuple[str, bool], ...]
    """The flags left out where the need is not met: (flag, takes a value)."""
    why: str


NEEDS = [
    Need(
        "cuda",
        r"--materialize-device cuda",
        (("--materialize", False), ("--materialize-device", True)),
        "allocates the pools on a CUDA GPU",
    ),
    Need(
        "cuda",
        r"--budget-from-device\b.*--materialize\b|--materialize\b.*--budget-from-device",
        (("--materialize", False), ("--materialize-device", True)),
        "allocates each rank's pool on its GPU, at the budget the GPU leaves (some 120 GiB a rank)",
    ),
    Need(
        "slow",
        r"--materialize\b",
        (("--materialize", False), ("--materialize-device", True)),
        "allocates every stage's pool on the CPU (seconds)",
    ),
    Need("slow", r"--plot\b", (("--plot", True),), "draws the figure with matplotlib (seconds)"),
    Need("sglang", r"--engine[= ](sglang|both)\b", (("--engine", True),), "runs the installed SGLang's code"),
]
"""What an example needs beyond the quick suite. The first row that matches a flag decides for it; without
the need, the flags are left out and everything else runs as printed."""

SINGLE_STAGE_ONLY = {
    "Qwen3NextForCausalLM": "models/qwen3_next.py:1036 asserts pp_group.is_first_rank and is_last_rank",
    "FalconH1ForCausalLM": "models/falcon_h1.py:456 asserts pp_group.is_first_rank and is_last_rank",
    "GraniteMoeHybridForCausalLM": "models/granitemoehybrid.py:509-510 ties lm_head to an embedding only "
    "the first stage builds (AttributeError on the later stages)",
    "Lfm2ForCausalLM": "models/lfm2.py:695 asserts pp_group.is_first_rank and is_last_rank",
    "Lfm2MoeForCausalLM": "models/lfm2_moe.py:606 asserts pp_group.is_first_rank and is_last_rank",
}
"""Model classes SGLang 0.5.23 (the newest release) stops at start-up under pipeline parallelism: no
example may derive one at pp_size > 1, whatever the checker says of it."""

SCHEMATIC: dict[tuple[str, str], str] = {
    (
        "docs/postflight.md",
        "kubectl logs -l LABEL --tail=-1 --prefix | python -m checker postflight --report preflight.json - "
        "# the pods' logs",
    ): "a form: the serving pods' label; their logs piped in (run in tests/test_postflight_launchers.py)",
    ("docs/postflight.md", "python -m checker postflight --report ... --quiet"): "prose: what the bench runs",
    ("docs/launchers.md", "launchers/postflight.sh REPORT LOG..."): "prose: the post-flight script, by name",
    ("README.md", "torchrun ... -m checker [check]"): "the commands table: a form",
    ("README.md", "torchrun ... -m checker sweep"): "the commands table: a form",
    ("README.md", "torchrun --no-python pp-capacity-checker ..."): "prose: the console script under torchrun",
    ("docs/derive-plan-sweep.md", "torchrun ... -m checker check"): "prose: the preflight, by name",
    ("docs/how-it-computes.md", "torchrun --standalone --nproc-per-node 8 -m checker sweep ..."): (
        "prose: the distributed sweep, by name"
    ),
    (
        "docs/performance.md",
        "torchrun --standalone --nproc-per-node N -m checker --model kimi-k3 --budget-gib 8",
    ): ("the benchmark's command, for N = 2 .. 32 ranks"),
    ("docs/launchers.md", "launchers/torchrun.sh ... || true"): "prose: what every recipe runs",
    ("docs/launchers.md", "launchers/read-verdict.sh REPORT"): "prose: the verdict reader, by name",
    (
        "docs/example-divergent.md",
        "torchrun --nnodes 2 --nproc-per-node 2 ... -m checker check --model kimi-k3 --budget-gib 8 "
        "--mamba-full-memory-ratio 0.5 --report report.json --junit junit.xml",
    ): "the run that made the page: tests/harness.py's launch, one node exporting a partition",
    (
        "launchers/slurm.sbatch",
        "sbatch --nodes 4 launchers/slurm.sbatch ... # NNODES follows the allocation",
    ): ("a form: NNODES follows --nodes"),
    (
        "launchers/slurm.sbatch",
        "sbatch --wait ... && echo consistent # in CI: the batch script exits with the verdict's code",
    ): "a form: sbatch --wait in CI",
}
"""(file, command): a form with ``...`` or a placeholder for what the user fills in; not run."""

PROSE: dict[tuple[str, str], str] = {
    ("README.md", "| `python -m checker derive` |"): "the commands table: the command's name",
    ("README.md", "| `python -m checker plan` |"): "the commands table: the command's name",
    ("README.md", "| `python -m checker postflight` |"): "the commands table: the command's name",
    ("docs/preflight.md", "(`-m checker` and `-m checker check` are the same)"): "prose",
    ("docs/performance.md", "(`-m checker` puts the working directory first on `sys.path`"): "prose",
    ("docs/engine.md", "(the one that runs `python -m sglang.launch_server`)"): "a comment in an example",
    ("docs/launchers.md", "(`... -- python -m sglang.launch_server --model-path ..."): "prose: a form",
    ("docs/preflight.md", "by hub id as often as by directory: `-- python -m sglang.launch_server"): (
        "prose: a launch command's form, with a hub id"
    ),
    (
        "docs/json-output.md",
        "sglang.launch_server: sglang.chunked_prefill_size=8192",
    ): "a value in the report",
    (
        "docs/json-output.md",
        "| `python -m sglang.launch_server ARGS` /",
    ): "a table: the launch command's forms",
    ("README.md", "sglang.launch_server ARGS`, `sglang serve ARGS`"): "prose: the launch command's forms",
    ("launchers/torchrun.sh", '-m checker check --backend "$BACKEND" "$@"'): "the script's own code",
}
"""(file, text on the line): a line that names a command without being an example of one."""

EXPECTED_EXIT: dict[tuple[str, str], int] = {
    # (file, part of the checker command) -> the exit code the page shows it ending with
    ("docs/preflight.md", "--policy own-share --mamba-full-memory-ratio 0.5"): 1,  # the divergent example
    ("docs/preflight.md", "Qwen3-Next-80B-A3B --pp-size 2 --tp-size 2"): 2,  # a start-up refusal, shown
    ("docs/preflight.md", "--pp-size 3 --nnodes 2"): 2,  # an argument check's refusal, shown
    ("docs/postflight.md", "other-node1.log"): 1,  # node 1 started with smaller pools
    ("checker postflight --help", "other-node1.log"): 1,
}

INVENTORY: dict[str, int] = {
    "README.md": 5,
    "docs/derive-plan-sweep.md": 8,
    "docs/engine.md": 3,
    "docs/how-it-computes.md": 1,
    "docs/launchers.md": 2,
    "docs/materialize.md": 4,
    "docs/preflight.md": 6,
    "launchers/torchrun.sh": 2,
    "launchers/read-verdict.sh": 1,
    "launchers/slurm.sbatch": 2,
    "launchers/github-actions.yml": 2,
    "launchers/gitlab-ci.yml": 1,
    "launchers/k8s-pytorchjob.yaml": 2,
    "checker --help": 2,
    "checker check --help": 2,
    "checker derive --help": 8,
    "checker plan --help": 6,
    "checker sweep --help": 5,
    "docs/postflight.md": 5,  # the two forms of the weights-from-log block count once each
    "checker postflight --help": 3,
}
"""How many checker commands each source runs (check, derive, plan, sweep; by torchrun, a launcher script
or a recipe). A changed count fails :func:`test_inventory`: an example that stops being extracted cannot
pass unnoticed, and a new one is counted when it is added."""

NOT_RUN_STEPS = {
    ("launchers/github-actions.yml", "Serve smoke test, the same launch command"): (
        "starts the SGLang server for real (GPUs, SGLang and the model's weights)"
    ),
}

# ---- extraction -------------------------------------------------------------------------------------------

COMMAND_WORDS = (
    "python",
    "python3",
    "torchrun",
    "sbatch",
    "kubectl",
    "pip",
    "pytest",
    "rm",
    "mkdir",
    "sudo",
    "launchers/torchrun.sh",
    "launchers/read-verdict.sh",
    "launchers/slurm.sbatch",
    "pp-capacity-checker",
)
"""A code line is a command when its first word (after VAR=value assignments) is one of these."""
MARKER = re.compile(
    r"-m checker\b|pp-capacity-checker |launchers/(torchrun\.sh|slurm\.sbatch)\s+-|\bsbatch\s"
    r"|sglang\.launch_server"
)
"""A line that looks like a checker command or a deployment's launch command."""
CHECKER_COMMAND = re.compile(
    r"-m checker\b|pp-capacity-checker |launchers/torchrun\.sh\s|launchers/slurm\.sbatch\s"
)
"""One checker command in an example's text (the count a run must reach)."""
INLINE_COMMAND = re.compile(
    r"^(python3? -m checker|pp-capacity-checker|torchrun .*(-m checker|pp-capacity-checker)"
    r"|launchers/\S+\.(sh|sbatch)|sbatch) "
)
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(\S*)")
SHELL_LANGS = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Unit:
    """One example: the shell text bash runs as printed, and where it came from."""

    file: str
    line: int
    shell: str
    lines: frozenset[int] = frozenset()
    """The lines of ``file`` it was read from."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables its recipe defines for it."""
    bash_opts: tuple[str, ...] = ()
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.label or self.line}"

    def checker_commands(self) -> int:
        """How many checker commands its text holds (a bash comment's are not commands)."""
        code = "\n".join(
            line.split(" #", 1)[0] for line in self.shell.splitlines() if not line.startswith("#")
        )
        return len(CHECKER_COMMAND.findall(code))


@dataclass(frozen=True)
class Form:
    """A command shown as a form, not run."""

    file: str
    text: str
    lines: frozenset[int]


def _is_command(text: str) -> bool:
    words = text.split()
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words.pop(0)
    return bool(words) and words[0] in COMMAND_WORDS


def _is_schematic(text: str) -> bool:
    """A form rather than a command: an elision (``...``) or a placeholder in capitals (N, ARGS)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    return any(w == "..." or re.fullmatch(r"[A-Z][A-Z_]*|<[^>]+>", w) for w in words)


def _logical_lines(lines: Sequence[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """Backslash continuations joined: (line numbers, text)."""
    out: list[tuple[list[int], str]] = []
    numbers: list[int] = []
    text = ""
    for n, raw in lines:
        numbers.append(n)
        if raw.rstrip().endswith("\\"):
            text += raw.rstrip()[:-1] + " "
            continue
        out.append((numbers, text + raw))
        numbers, text = [], ""
    if numbers:
        out.append((numbers, text))
    return out


def _code_unit(
    file: str,
    lines: Sequence[tuple[int, str]],
    forms: list[Form],
    *,
    transcript: bool = False,
    shell: bool = False,
) -> Unit | None:
    """A block of code lines as one example (its forms set aside); None when it runs no checker command
    (an output block, a YAML snippet, another tool's commands)."""
    kept: list[str] = []
    numbers: set[int] = set()
    for line_numbers, text in _logical_lines(lines):
        command = text.strip()
        if transcript:
            if not command.startswith("$ "):
                continue  # a transcript's output
            command = command[2:]
        if _is_command(command) and _is_schematic(command):
            forms.append(Form(file, " ".join(command.split()), frozenset(line_numbers)))
            continue
        kept.append(command if transcript else text)
        numbers.update(line_numbers)
    # A shell block runs whole; in a script's comments only lines that start with a command are code.
    if not any(MARKER.search(k) for k in kept if shell or _is_command(k.strip())):
        return None
    return Unit(file=file, line=min(numbers), shell="\n".join(kept) + "\n", lines=frozenset(numbers))


def markdown_units(file: str, text: str) -> tuple[list[Unit], list[Form]]:
    """A Markdown page's examples, and the forms it shows."""
    units: list[Unit] = []
    forms: list[Form] = []
    lines = text.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence, lang = m.group(1), m.group(2).lower()
            start = i = i + 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                i += 1
            block = [(n + 1, lines[n]) for n in range(start, i)]
            i += 1
            first = next((t.strip() for _, t in block if t.strip()), "")
            if lang in SHELL_LANGS or _is_command(first) or first.startswith("$ "):
                transcript = first.startswith("$ ")
                unit = _code_unit(file, block, forms, transcript=transcript, shell=lang in SHELL_LANGS)
                if unit:
                    units.append(unit)
            continue
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            start = i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            block = [(n + 1, lines[n][4:]) for n in range(start, i) if lines[n].strip()]
            unit = _code_unit(file, block, forms)
            if unit:
                units.append(unit)
            continue
        prose.append((i + 1, lines[i]))
        i += 1
    # Inline code spans in the prose, which may wrap a line: each character keeps its line number.
    joined = "\n".join(t for _, t in prose)
    line_of = [n for n, t in prose for _ in range(len(t) + 1)]
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        span = " ".join(m.group(1).split())
        if not INLINE_COMMAND.match(span + " "):
            continue
        numbers = frozenset(line_of[m.start() : m.end()])
        if _is_schematic(span):
            forms.append(Form(file, span, numbers))
        elif re.search(r" --?[a-z]", span.replace(" -m ", " ")):
            units.append(Unit(file=file, line=min(numbers), shell=span + "\n", lines=numbers))
        # else only a command's name (`python -m checker derive`): listed in PROSE
    return units, forms


def comment_units(file: str, text: str) -> tuple[list[Unit], list[Form]]:
    """A script's usage comments: runs of ``#  code`` lines (two or more spaces after the ``#``)."""
    units: list[Unit] = []
    forms: list[Form] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not re.match(r"^# {2,}\S", lines[i]):
            i += 1
            continue
        start = i
        while i < len(lines) and re.match(r"^# {2,}\S|^#\s*$", lines[i]):
            i += 1
        block = [(n + 1, lines[n][1:].strip()) for n in range(start, i) if lines[n][1:].strip()]
        unit = _code_unit(file, block, forms)
        if unit:
            units.append(unit)
    return units, forms


def _yaml() -> Any:
    return pytest.importorskip("yaml", reason="PyYAML reads the CI and Kubernetes recipes")


def _lines_of(text: str, snippet: str) -> frozenset[int]:
    """The lines of ``text`` a YAML value was read from: those whose text the value holds (a folded
    scalar joins its lines, a block keeps them)."""
    flat = " ".join(snippet.split())
    found = set()
    for n, line in enumerate(text.splitlines(), 1):
        words = " ".join(re.sub(r"^(- )?([\w-]+: )?", "", line.strip()).split())
        if len(words) > 3 and words in flat:
            found.add(n)
    return frozenset(found)


def yaml_units(file: str, text: str) -> list[Unit]:
    """The shell a CI or Kubernetes recipe hands to bash, with the variables it defines for it."""
    doc = _yaml().safe_load(text)
    units: list[Unit] = []

    def unit(shell: str, env: Mapping[str, str], label: str, opts: tuple[str, ...]) -> Unit:
        lines = _lines_of(text, shell) | _lines_of(text, "\n".join(env.values()))
        return Unit(
            file=file,
            line=min(_lines_of(text, shell.strip().splitlines()[0]) or {0}),
            shell=shell,
            lines=lines,
            env=tuple(env.items()),
            bash_opts=opts,
            label=label,
        )

    if "jobs" in doc:  # GitHub Actions: each step's run, in `bash -eo pipefail` as GitHub runs it
        for job_name, job in doc["jobs"].items():
            env = {k: str(v) for k, v in {**(doc.get("env") or {}), **(job.get("env") or {})}.items()}
            for step in job["steps"]:
                name = step.get("name", "")
                if "run" in step and (file, name) not in NOT_RUN_STEPS:
                    units.append(unit(step["run"], env, f"{job_name}/{name}", ("-eo", "pipefail")))
    elif doc.get("kind") == "PyTorchJob":  # each pod's container args, under the operator's variables
        for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            container = spec["template"]["spec"]["containers"][0]
            env = {}
            for entry in container.get("env", []):
                if "value" in entry:
                    env[entry["name"]] = str(entry["value"])
                else:
                    env[entry["name"]] = K8S_FIELD_REFS[entry["valueFrom"]["fieldRef"]["fieldPath"]]
            env.update(K8S_POD_ENV[role])
            units.append(unit(container["args"][0], env, role, ()))
    else:  # GitLab CI: each job's script, with the pipeline's and the job's variables
        top = {k: str(v) for k, v in (doc.get("variables") or {}).items()}
        for job_name, job in doc.items():
            if isinstance(job, dict) and "script" in job:
                env = {**top, **{k: str(v) for k, v in (job.get("variables") or {}).items()}}
                units.append(unit("\n".join(job["script"]), env, job_name, ("-eo", "pipefail")))
    return units


def help_pages() -> dict[str, str]:
    """Every --help a user reads: the top level's and each command's."""
    import argparse

    from checker.cli.main import build_parser

    parser = build_parser()
    pages = {"checker --help": parser.format_help()}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        pages[f"checker {name} --help"] = p.format_help()
    return pages


def help_units(pages: Mapping[str, str], env: Mapping[str, str]) -> list[Unit]:
    """Each line of a help page's ``examples:`` (its ``#`` lines say what the next one does)."""
    units = []
    for page, text in pages.items():
        block = text.split("\nexamples:\n", 1)[1].split("\n\n", 1)[0]
        for n, line in enumerate(block.splitlines(), 1):
            if not line.strip().startswith("#"):
                units.append(Unit(file=page, line=n, shell=line.strip() + "\n", env=tuple(env.items())))
    return units


def help_env() -> dict[str, str]:
    """``$SGLANG_LAUNCH`` in check's --help ("the launch command kept in one CI variable"): the GitLab
    recipe's CI variable of that name."""
    text = (REPO_ROOT / "launchers/gitlab-ci.yml").read_text()
    return {"SGLANG_LAUNCH": str(_yaml().safe_load(text)["variables"]["SGLANG_LAUNCH"])}


@dataclass
class Extracted:
    units: list[Unit]
    forms: list[Form]


def extract(texts: Mapping[str, str], pages: Mapping[str, str] | None = None) -> Extracted:
    """Every example of the given files (path -> text) and --help pages (title -> text)."""
    units: list[Unit] = []
    forms: list[Form] = []
    for file, text in texts.items():
        if file.endswith(".md"):
            found, shown = markdown_units(file, text)
        else:
            found, shown = comment_units(file, text)
            if file.endswith((".yml", ".yaml")):
                found += yaml_units(file, text)
        units += found
        forms += shown
    if pages:
        units += help_units(pages, help_env())
    return Extracted(units=units, forms=forms)


def repository_texts() -> dict[str, str]:
    return {f: (REPO_ROOT / f).read_text() for f in [*MARKDOWN, *SHELL_RECIPES, *YAML_RECIPES]}


def uncovered(texts: Mapping[str, str], extracted: Extracted) -> list[str]:
    """Lines that look like a command but belong to no example, form or :data:`PROSE` entry."""
    covered: dict[str, set[int]] = {}
    for item in [*extracted.units, *extracted.forms]:
        covered.setdefault(item.file, set()).update(item.lines)
    missing = []
    for file, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            if not MARKER.search(line) or n in covered.get(file, set()):
                continue
            if any(f == file and snippet in line for f, snippet in PROSE):
                continue
            missing.append(f"{file}:{n}: {line.strip()}")
    return missing


# ---- running an example under bash, with stand-ins --------------------------------------------------------

RECORD = r"""#!/usr/bin/env bash
# A stand-in: record what was asked (argv, working directory, environment); run nothing.
record() {
    local files=("$EXAMPLE_RECORDS"/*.argv) n name
    [[ -e "${files[0]}" ]] || files=()
    printf -v n '%04d' "${#files[@]}"
    printf '%s\0' "$@" > "$EXAMPLE_RECORDS/$n-$1.argv"
    printf '%s\n' "$PWD" > "$EXAMPLE_RECORDS/$n-$1.cwd"
    for name in $(compgen -e); do printf '%s=%s\0' "$name" "${!name}"; done > "$EXAMPLE_RECORDS/$n-$1.env"
}
"""
ENTRY = "import sys, test_examples as t; sys.exit(t.{}(sys.argv[1:]))"
"""How the end-to-end stand-ins run the checker (this module's entry points, in a fresh process)."""
STANDINS = {
    "torchrun": RECORD
    + f"""if [[ -n "${{EXAMPLE_END_TO_END:-}}" ]]; then
    exec "$EXAMPLE_REAL_PYTHON" -c '{ENTRY.format("torchrun_main")}' "$@"
fi
record torchrun "$@"
""",
    "python": RECORD
    + f"""case "${{1:-}} ${{2:-}}" in
    "-m checker")
        if [[ -n "${{EXAMPLE_END_TO_END:-}}" ]]; then
            exec "$EXAMPLE_REAL_PYTHON" -c '{ENTRY.format("checker_main")}' "${{@:3}}"
        fi
        record checker "${{@:3}}"; exit 0 ;;
    "-m pip") record pip "${{@:3}}"; exit 0 ;;
    "-m pytest") record pytest "${{@:3}}"; exit 0 ;;
    "-m sglang.launch_server") record server "$@"; exit 0 ;;
esac
exec "$EXAMPLE_REAL_PYTHON" "$@"
""",
    "sbatch": RECORD
    + r"""# sbatch [options] SCRIPT ARGS: Slurm's variables for the allocation, then the batch script itself.
nodes=""
while [[ "${1:-}" == -* ]]; do
    case "$1" in
        --nodes=*) nodes="${1#*=}"; shift ;;
        --nodes|-N) nodes="$2"; shift 2 ;;
        *) shift ;;
    esac
done
script="$1"; shift
if [[ "$script" != *launchers/slurm.sbatch ]]; then record server sbatch "$script" "$@"; exit 0; fi
[[ -n "$nodes" ]] || nodes="$(sed -n 's/^#SBATCH --nodes=//p' "$script")"
export SLURM_JOB_NUM_NODES="$nodes" SLURM_JOB_NODELIST="node[0-$((nodes - 1))]" SLURM_JOB_ID=4242
export SLURM_SUBMIT_DIR="$PWD"
exec bash "$script" "$@"
""",
    "scontrol": r"""#!/usr/bin/env bash
# scontrol show hostnames LIST: the allocation's node names, one a line.
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do echo "node$n"; done
""",
    "srun": r"""#!/usr/bin/env bash
# srun --ntasks-per-node=1 CMD: node 0's task (its torchrun names every node's ranks).
while [[ "${1:-}" == -* ]]; do shift; done
SLURM_NODEID=0 SLURMD_NODENAME=node0 exec "$@"
""",
    "nvidia-smi": r"""#!/usr/bin/env bash
for ((n = 0; n < EXAMPLE_GPUS; n++)); do echo "GPU $n: NVIDIA H200 (UUID: GPU-$n)"; done
""",
    "hostname": "#!/usr/bin/env bash\necho 10.0.0.1\n",
    "kubectl": RECORD + 'record kubectl "$@"\n',
    "pip": RECORD + 'record pip "$@"\n',
    "pytest": RECORD + 'record pytest "$@"\n',
    "sudo": RECORD + 'record sudo "$@"\n',
    "pp-capacity-checker": RECORD
    + f"""if [[ -n "${{EXAMPLE_END_TO_END:-}}" ]]; then
    exec "$EXAMPLE_REAL_PYTHON" -c '{ENTRY.format("checker_main")}' "$@"
fi
record checker "$@"
""",
}
STANDINS["python3"] = STANDINS["python"]
NOT_RUN_KINDS = ("pip", "pytest", "server", "kubectl", "sudo")
"""What the stand-ins record and never run: installs, the test suite, a server start, a cluster's CLI."""


def make_standins(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in STANDINS.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


def make_work(directory: Path) -> Path:
    """A directory laid out as a checkout, for relative paths: examples/ and launchers/ from this one."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("examples", "launchers"):
        if not (directory / name).exists():
            (directory / name).symlink_to(REPO_ROOT / name)
    return directory


def map_paths(text: str, work: Path) -> str:
    for pattern, replacement, _why in PATH_MAP:
        text = re.sub(pattern, replacement.replace("{work}", str(work)), text)
    return text


@dataclass
class Invocation:
    """What a stand-in was asked to run."""

    kind: str
    """torchrun, checker (python -m checker), or one of :data:`NOT_RUN_KINDS`."""
    argv: list[str]
    cwd: str
    env: dict[str, str]


@dataclass
class BashRun:
    code: int
    out: str
    err: str
    invocations: list[Invocation]


def run_bash(unit: Unit, work: Path, standins: Path, *, end_to_end: bool = False) -> BashRun:
    """The example as printed (paths mapped by :data:`PATH_MAP`), by bash, from ``work``."""
    records = work / ".records"
    records.mkdir(exist_ok=True)
    for old in records.iterdir():
        old.unlink()
    env = {
        "PATH": f"{standins}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", str(work)),
        "LANG": "C.UTF-8",
        "PYTHON": sys.executable,  # read-verdict.sh's interpreter: the real one
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]),
        "EXAMPLE_REAL_PYTHON": sys.executable,
        "EXAMPLE_RECORDS": str(records),
        "EXAMPLE_GPUS": str(GPUS_ON_A_NODE),
        "OMP_NUM_THREADS": "1",
        **CI_ENV,
        **{k: map_paths(v, work) for k, v in unit.env},
    }
    if end_to_end:
        env["EXAMPLE_END_TO_END"] = "1"
    res = subprocess.run(
        ["bash", "--noprofile", "--norc", *unit.bash_opts, "-c", map_paths(unit.shell, work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=END_TO_END_TIMEOUT_S if end_to_end else BASH_TIMEOUT_S,
    )
    invocations = []
    for argv_file in sorted(records.glob("*.argv")):
        words = [w.decode() for w in argv_file.read_bytes().split(b"\0")[:-1]]
        pairs = argv_file.with_suffix(".env").read_bytes().split(b"\0")
        recorded = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
        cwd = argv_file.with_suffix(".cwd").read_text().strip()
        invocations.append(Invocation(kind=words[0], argv=words[1:], cwd=cwd, env=recorded))
    return BashRun(code=res.returncode, out=res.stdout, err=res.stderr, invocations=invocations)


# ---- a torchrun world, every rank in this process -----------------------------------------------------

TORCHRUN_FLAGS = {"--standalone", "--no-python", "--run-path"}
TORCHRUN_OPTIONS = {
    "--nnodes",
    "--nproc-per-node",
    "--max-restarts",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--rdzv-conf",
    "--local-addr",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--monitor-interval",
}


@dataclass(frozen=True)
class TorchrunWorld:
    nnodes: int
    nproc_per_node: int
    module: str
    args: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def read_torchrun(argv: Sequence[str]) -> TorchrunWorld:
    """torchrun's command line: the world it starts and the module it runs. The options the examples
    use; any other is refused, so a mistyped option fails here as torchrun would refuse it."""
    values: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i] != "-m" and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        name = name.replace("_", "-")
        if name in TORCHRUN_FLAGS:
            i += 1
        elif name in TORCHRUN_OPTIONS and (eq or i + 1 < len(argv)):
            values[name] = value if eq else argv[i + 1]
            i += 1 if eq else 2
        else:
            raise ValueError(f"torchrun: unrecognized option {argv[i]!r}")
    if i < len(argv) and argv[i] != "-m":  # --no-python pp-capacity-checker: the console script
        module, args = ("checker" if argv[i] == "pp-capacity-checker" else argv[i]), argv[i + 1 :]
    elif i + 1 < len(argv):
        module, args = argv[i + 1], argv[i + 2 :]
    else:
        raise ValueError("torchrun: no -m MODULE")
    return TorchrunWorld(
        nnodes=int(values.get("--nnodes", "1").split(":")[-1]),
        nproc_per_node=int(values.get("--nproc-per-node", "1")),
        module=module,
        args=tuple(args),
    )


class _Rows(list):  # type: ignore[type-arg]
    """The gathered rows as check's job reads them (``.tolist()``), without a tensor."""

    def tolist(self) -> list[Any]:
        return list(self)


def rank_env(rank: int, world: TorchrunWorld) -> Any:
    from checker.distributed.launch_env import RankEnv

    node = rank // world.nproc_per_node
    return RankEnv(
        rank=rank,
        world_size=world.world_size,
        local_rank=rank % world.nproc_per_node,
        local_world_size=world.nproc_per_node,
        node_rank=node,
        host=os.environ.get("CHECKER_HOSTNAME") or f"node{node}",
        master_addr=None,
        master_port=None,
        use_agent_store=False,
        restart_count=0,
        max_restarts=0,
    )


def _device(rank: int, on_gpu: bool) -> Any:
    """The device an NCCL rank uses (cuda:LOCAL_RANK, wrapped over the GPUs there are); None on a CPU."""
    if not on_gpu:
        return None
    import torch

    return torch.device("cuda", rank % torch.cuda.device_count())


def check_world(args: Any, world: TorchrunWorld, *, on_gpu: bool = False) -> int:
    """check's job on every rank of ``world`` in turn, in the run protocol's order
    (:func:`checker.distributed.exchange.run`: local facts, headers, rows, the verdict; rank 0 publishes),
    what the ranks exchange handed over in this process."""
    from checker.commands.check_config import config_from_args
    from checker.commands.check_job import CheckJob
    from checker.core.errors import CheckerInputError
    from checker.distributed.exchange import JobContext, group_errors

    backend = "nccl" if on_gpu else "gloo"
    jobs, contexts = [], []
    for rank in range(world.world_size):
        env = rank_env(rank, world)
        config = config_from_args(args, env)  # a refused flag: main's one line, exit 2
        ctx = JobContext(
            env=env, backend=backend, device=_device(env.local_rank, on_gpu), deadline=time.monotonic() + 600
        )
        jobs.append(CheckJob(config=config, output=config.output))
        contexts.append(ctx)
    locals_ = [job.local(ctx) for job, ctx in zip(jobs, contexts, strict=True)]
    headers = [job.header(ctx, local) for job, ctx, local in zip(jobs, contexts, locals_, strict=True)]
    rows: list[list[int]] = []
    messages: list[str] = []
    derived = []
    for job, ctx, local in zip(jobs, contexts, locals_, strict=True):
        try:
            mine, body = job.payload(ctx, local, headers)
            derived.append(mine)
            rows.append(list(body))
            messages.append("")
        except CheckerInputError as exc:
            derived.append(local)
            rows.append([])
            messages.append(str(exc))
    if any(messages):
        outcome = jobs[0].errors(contexts[0], derived[0], group_errors(messages))
    else:
        outcome = jobs[0].decide(contexts[0], derived[0], _Rows(rows), headers)  # type: ignore[arg-type]
    jobs[0].publish(contexts[0], outcome)
    return jobs[0].exit_code(outcome)


def sweep_world(args: Any, world: TorchrunWorld) -> int:
    """sweep under torchrun: every rank lays out its stage as the distributed sweep does (a world that is
    not pp x tp is refused there), then the sweep at that pp size, derived in this process."""
    from checker.commands import sweep
    from checker.core.sizing.layout import layout

    config = sweep.config_from_args(args)
    s = config.sizing
    sizes = {
        layout(world.world_size, rank, pp_size=s.pp_size, tp_size=s.tp_size, dp_size=s.dp_size)[0]
        for rank in range(world.world_size)
    }
    (pp_size,) = sizes
    return sweep.run_single_process(
        dataclasses.replace(config, sizing=dataclasses.replace(s, pp_size=pp_size))
    )


@dataclass
class CheckerRun:
    """One checker command, run here."""

    argv: list[str]
    world: TorchrunWorld | None
    code: int
    out: str
    err: str
    deployments: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    """(the model's architectures, pp_size) of every derivation it made."""
    left_out: list[str] = field(default_factory=list)
    """What :data:`NEEDS` left out, and why."""

    @property
    def shown(self) -> str:
        world = f" (torchrun world {self.world.world_size})" if self.world else ""
        return shlex.join(self.argv) + world


def _architectures(geometry_name: str) -> tuple[str, ...]:
    """The architectures of the model a derivation read (``PATH (family)`` or a preset's name)."""
    from checker.families.geometry import model_architectures

    path = geometry_name.rsplit(" (", 1)[0]
    if os.path.exists(path):
        return tuple(model_architectures(model=None, model_config=path))
    return tuple(model_architectures(model=path, model_config=None))


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")


@contextlib.contextmanager
def _environ(recorded: Mapping[str, str]) -> Iterator[None]:
    """The recorded SGLang and checker variables, and none of this process's own."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("SGLANG_", "CHECKER_", "GITHUB_STEP_SUMMARY", "TORCHELASTIC_")) or key in (
            *TORCHRUN_VARIABLES,
            "MASTER_PORT",
        ):
            del os.environ[key]
    os.environ.update({k: v for k, v in recorded.items() if k.startswith(("SGLANG_", "CHECKER_"))})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def needs_of(argv: Sequence[str]) -> list[Need]:
    """The rows of :data:`NEEDS` an example's checker command meets (one per group of flags)."""
    ours = " ".join(argv[: list(argv).index("--")] if "--" in argv else argv)
    found: list[Need] = []
    for need in NEEDS:
        if re.search(need.when, ours) and not any(n.flags == need.flags for n in found):
            found.append(need)
    return found


def without(argv: Sequence[str], flags: Sequence[tuple[str, bool]]) -> list[str]:
    """``argv`` less ``flags`` (and their values) before ``--``."""
    cut = list(argv).index("--") if "--" in argv else len(argv)
    out, i = [], 0
    names = dict(flags)
    while i < cut:
        name = argv[i].split("=", 1)[0]
        if name in names:
            i += 1 + (names[name] and "=" not in argv[i])
            continue
        out.append(argv[i])
        i += 1
    return [*out, *argv[cut:]]


def with_assumed_free_memory(argv: Sequence[str]) -> list[str]:
    """``--budget-from-device`` on a CPU: :data:`ASSUMED_DEVICE_FREE_GIB`, before ``--``."""
    cut = list(argv).index("--") if "--" in argv else len(argv)
    ours = list(argv[:cut])
    if "--budget-from-device" in ours and not any(a.startswith("--device-free-gib") for a in ours):
        ours += ["--device-free-gib", ASSUMED_DEVICE_FREE_GIB]
    return [*ours, *argv[cut:]]


def run_checker(
    argv: Sequence[str],
    *,
    world: TorchrunWorld | None,
    cwd: str,
    env: Mapping[str, str],
    have: frozenset[str] = frozenset(),
) -> CheckerRun:
    """``python -m checker ARGV`` (or torchrun's ``-m checker ARGV`` on ``world``) in this process; what
    it needs and ``have`` lacks left out (:data:`NEEDS`)."""
    from unittest import mock

    from checker.cli.main import main
    from checker.commands import check, sweep
    from checker.core.sizing.sizing import CapacityInputs

    shown = list(argv)
    argv, left_out = list(argv), []
    for need in needs_of(argv):
        if need.need not in have:
            argv = without(argv, need.flags)
            left_out.append(f"without {'/'.join(f for f, _ in need.flags)} (needs {need.need}: {need.why})")
    on_gpu = "cuda" in have
    if world is not None and not on_gpu:
        argv = with_assumed_free_memory(argv)
    deployments: list[tuple[tuple[str, ...], int]] = []
    post_init = CapacityInputs.__post_init__

    def seen(inputs: Any) -> None:
        deployments.append((_architectures(inputs.geometry.name), inputs.pp_size))
        post_init(inputs)

    single_sweep = sweep.run
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(CapacityInputs, "__post_init__", seen))
        if world is not None:
            run_world = lambda args: check_world(args, world, on_gpu=on_gpu)  # noqa: E731
            run_sweep = lambda args: sweep_world(args, world) if world.world_size > 1 else single_sweep(args)  # noqa: E731
            stack.enter_context(mock.patch.object(check, "run", run_world))
            stack.enter_context(mock.patch.object(sweep, "run", run_sweep))
        stack.enter_context(_environ(env))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        os.chdir(cwd)
        stack.callback(os.chdir, here)
        try:
            code = main(argv)
        except SystemExit as exc:  # --help, a usage error argparse ends itself
            code = exc.code if isinstance(exc.code, int) else 1
    return CheckerRun(shown, world, code, out.getvalue(), err.getvalue(), deployments, left_out)


def _have() -> frozenset[str]:
    """What the end-to-end stand-ins may run (the slow group's)."""
    return frozenset(os.environ.get("EXAMPLE_HAVE", "slow").split(","))


def torchrun_main(argv: list[str]) -> int:
    """The end-to-end ``torchrun``: the world derived in this process, the report written by rank 0's
    job; torchrun's own exit code (1 when a rank fails)."""
    world = read_torchrun(argv)
    if world.module != "checker":
        print(f"torchrun stand-in: -m {world.module} is not the checker", file=sys.stderr)
        return 1
    res = run_checker(world.args, world=world, cwd=os.getcwd(), env=os.environ, have=_have())
    sys.stdout.write(res.out)
    sys.stderr.write(res.err)
    return 0 if res.code == 0 else 1


def checker_main(argv: list[str]) -> int:
    """The end-to-end ``python -m checker``."""
    res = run_checker(argv, world=None, cwd=os.getcwd(), env=os.environ, have=_have())
    sys.stdout.write(res.out)
    sys.stderr.write(res.err)
    return res.code


# ---- an example, run and judged ---------------------------------------------------------------------


@dataclass
class ExampleResult:
    bash: BashRun
    runs: list[CheckerRun]
    problems: list[str]


def expected_exit(file: str, argv: Sequence[str]) -> int:
    text = " ".join(argv)
    return next((code for (f, needle), code in EXPECTED_EXIT.items() if f == file and needle in text), 0)


def refusals(run: CheckerRun) -> list[str]:
    """What SGLang's newest release stops at start-up, whatever the checker said of it."""
    found = set()
    for archs, pp_size in run.deployments:
        for arch in archs:
            if arch in SINGLE_STAGE_ONLY and pp_size > 1:
                found.add(f"{arch} at pp_size {pp_size}: SGLang 0.5.23 {SINGLE_STAGE_ONLY[arch]}")
    return sorted(found)


def run_example(
    unit: Unit, work: Path, standins: Path, *, have: frozenset[str] = frozenset()
) -> ExampleResult:
    """Run one example as printed and say what is wrong with it (nothing: an empty list)."""
    bash = run_bash(unit, work, standins)
    problems: list[str] = []
    runs: list[CheckerRun] = []
    for inv in bash.invocations:
        if inv.kind not in ("torchrun", "checker"):
            continue
        world = None
        argv: Sequence[str] = inv.argv
        if inv.kind == "torchrun":
            try:
                world = read_torchrun(inv.argv)
            except ValueError as exc:
                problems.append(f"torchrun {shlex.join(inv.argv)}: {exc}")
                continue
            if world.module != "checker":
                problems.append(f"torchrun {shlex.join(inv.argv)}: runs -m {world.module}, not the checker")
                continue
            argv = world.args
        res = run_checker(argv, world=world, cwd=inv.cwd, env=inv.env, have=have)
        runs.append(res)
        want = expected_exit(unit.file, argv)
        if res.code != want:
            tail = " | ".join((res.err.strip() or res.out.strip()).splitlines()[-3:])
            problems.append(f"{res.shown}: exit {res.code}, expected {want}: {tail}")
        problems += [f"{res.shown}: {why}" for why in refusals(res)]
    reached = len(runs) + sum(p.startswith("torchrun ") for p in problems)
    if reached != unit.checker_commands():
        problems.append(
            f"reached {reached} of its {unit.checker_commands()} checker commands "
            f"(bash exit {bash.code}: {bash.err.strip()[-400:]})"
        )
    return ExampleResult(bash=bash, runs=runs, problems=problems)


# ---- the tests ------------------------------------------------------------------------------------------

# The end-to-end stand-ins import this module for its entry points only: they extract nothing.
EXTRACTED = (
    Extracted([], []) if os.environ.get("EXAMPLE_END_TO_END") else extract(repository_texts(), help_pages())
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("examples")
    return make_work(base / "work"), make_standins(base / "bin")


@pytest.mark.parametrize("unit", EXTRACTED.units, ids=lambda u: u.id)
def test_example_runs_as_printed(unit: Unit, sandbox: tuple[Path, Path]) -> None:
    """Each example, run as printed, ends as its page says (exit 0 unless listed), reaches every checker
    command it holds, and derives no deployment SGLang would stop at start-up. What needs a GPU, SGLang
    or seconds is left out here (:data:`NEEDS`) and run whole by the tests below."""
    result = run_example(unit, *sandbox)
    assert not result.problems, f"{unit.id}:\n" + "\n".join(result.problems)


def test_inventory() -> None:
    """Each source holds as many checker commands as :data:`INVENTORY` says, and every form it shows is
    listed: an example the extraction stops seeing fails here, not silently."""
    counts: dict[str, int] = {}
    for unit in EXTRACTED.units:
        counts[unit.file] = counts.get(unit.file, 0) + unit.checker_commands()
    counts = {f: n for f, n in counts.items() if n}
    changed = {f: (INVENTORY.get(f, 0), counts.get(f, 0)) for f in {*counts, *INVENTORY}}
    changed = {f: c for f, c in changed.items() if c[0] != c[1]}
    assert not changed, (
        f"checker commands per source changed, (listed, found): {changed}; once every example of the "
        "source runs (test_example_runs_as_printed), update INVENTORY"
    )
    assert sorted((f.file, f.text) for f in EXTRACTED.forms) == sorted(SCHEMATIC)


def test_every_command_line_is_extracted() -> None:
    """Every line of README.md, docs/ and launchers/ that looks like a checker or launch command belongs
    to an example that runs, to a listed form, or to a listed line of prose; and every listed line of
    prose is still there (a stale entry would hide nothing, but says something false)."""
    texts = repository_texts()
    assert uncovered(texts, EXTRACTED) == []
    for (file, snippet), _why in PROSE.items():
        assert snippet in texts[file], (file, snippet)


def test_the_extraction_misses_nothing_it_is_shown() -> None:
    """The coverage check bites: a command written as plain prose, outside any code, is named."""
    page = "Run it first:\n\npython -m checker derive --model kimi-k3\n\nthen deploy.\n"
    extracted = extract({"docs/new.md": page})
    assert extracted.units == []
    assert uncovered({"docs/new.md": page}, extracted) == [
        "docs/new.md:3: python -m checker derive --model kimi-k3"
    ]


BROKEN = {
    "an unknown flag": "```bash\npython -m checker derive --modle kimi-k3\n```\n",
    "a missing model directory": (
        "```bash\npython -m checker plan --model-path examples/models/M --suggest-partition\n```\n"
    ),
    "a deployment SGLang stops at start-up": (
        "```bash\ntorchrun --nproc-per-node 2 -m checker --budget-gib 8 -- python -m sglang.launch_server "
        "--model-path /models/Qwen3-Next-80B-A3B --pp-size 2\n```\n"
    ),
    "a world that is not pp x tp": (
        "```bash\ntorchrun --nproc-per-node 4 -m checker --budget-gib 8 -- --model-path "
        "examples/models/Kimi-Linear-48B-A3B --pp-size 2\n```\n"
    ),
    "an option torchrun does not have": (
        "```bash\ntorchrun --nproc-per-nod 2 -m checker --model kimi-k3 --budget-gib 8\n```\n"
    ),
    "a command bash never reaches": "```bash\nfalse && python -m checker derive --model kimi-k3\n```\n",
    "an inline example with a typo": "See `python -m checker derive --model kimi-k3 --pp-size eight`.\n",
}
FIXED = {
    "an unknown flag": "```bash\npython -m checker derive --model kimi-k3\n```\n",
    "a missing model directory": (
        "```bash\npython -m checker plan --model-path examples/models/Nemotron-H-8B-Base-8K "
        "--suggest-partition\n```\n"
    ),
    "a deployment SGLang stops at start-up": (
        "```bash\ntorchrun --nproc-per-node 2 -m checker --budget-gib 8 -- python -m sglang.launch_server "
        "--model-path /models/Qwen3-Next-80B-A3B --tp-size 2\n```\n"
    ),
    "a world that is not pp x tp": (
        "```bash\ntorchrun --nproc-per-node 2 -m checker --budget-gib 8 -- --model-path "
        "examples/models/Kimi-Linear-48B-A3B --pp-size 2\n```\n"
    ),
    "an option torchrun does not have": (
        "```bash\ntorchrun --nproc-per-node 2 -m checker --model kimi-k3 --budget-gib 8\n```\n"
    ),
    "a command bash never reaches": "```bash\ntrue && python -m checker derive --model kimi-k3\n```\n",
    "an inline example with a typo": "See `python -m checker derive --model kimi-k3 --pp-size 8`.\n",
}


@pytest.mark.parametrize("defect", BROKEN)
def test_a_broken_example_fails(defect: str, sandbox: tuple[Path, Path]) -> None:
    """The run bites: each defect makes its example fail, and the same example fixed passes (so it is the
    defect that failed it). The deployment SGLang stops at start-up fails whether or not the checker
    refuses it itself."""
    (broken,) = extract({"docs/example.md": BROKEN[defect]}).units
    assert run_example(broken, *sandbox).problems, defect
    (fixed,) = extract({"docs/example.md": FIXED[defect]}).units
    assert run_example(fixed, *sandbox).problems == [], defect


def test_a_broken_recipe_fails(sandbox: tuple[Path, Path]) -> None:
    """A CI recipe whose launch command (its CI variable) names a single-stage model at pp 2 fails, as
    does one whose launcher line is cut off by a failing command before it."""
    recipe = (REPO_ROOT / "launchers/gitlab-ci.yml").read_text()
    single_stage = recipe.replace("/models/Kimi-Linear-48B-A3B", "/models/Falcon-H1-0.5B")
    (unit,) = [
        u for u in extract({"launchers/gitlab-ci.yml": single_stage}).units if "torchrun.sh" in u.shell
    ]
    problems = run_example(unit, *sandbox).problems
    assert problems and any("Falcon" in p or "falcon" in p for p in problems), problems
    cut = recipe.replace('- rm -rf "$OUT" && mkdir -p "$OUT"', "- test -d /no/such/dir")
    (unit,) = [u for u in extract({"launchers/gitlab-ci.yml": cut}).units if "torchrun.sh" in u.shell]
    assert any("reached 0 of its 1" in p for p in run_example(unit, *sandbox).problems)


def test_torchrun_worlds_read_as_torch_reads_them(sandbox: tuple[Path, Path]) -> None:
    """The world an example's torchrun starts is read here as torch's own torchrun parser reads it: every
    torchrun line the examples show, and those launchers/torchrun.sh builds (one node, several nodes)."""
    torch_run = pytest.importorskip("torch.distributed.run")
    argvs = []
    for unit in EXTRACTED.units:
        for line in unit.shell.replace("\\\n", " ").splitlines():
            if re.match(r"^(\w+=\S+ )*torchrun ", line):
                words = shlex.split(line.split(" || ")[0], comments=True)
                argvs.append(words[words.index("torchrun") + 1 :])
    for unit in EXTRACTED.units:
        if unit.id in ("README.md:87", "launchers/k8s-pytorchjob.yaml:Master"):
            argvs += [inv.argv for inv in run_bash(unit, *sandbox).invocations if inv.kind == "torchrun"]
    assert len(argvs) >= 12
    nodes = set()
    for argv in argvs:
        ours = read_torchrun(argv)
        theirs = torch_run.get_args_parser().parse_args(argv)
        assert (ours.module, list(ours.args)) == ("checker", theirs.training_script_args), argv
        assert theirs.module and theirs.training_script == "checker", argv
        assert ours.nproc_per_node == int(theirs.nproc_per_node), argv
        assert ours.nnodes == int(str(theirs.nnodes).split(":")[-1]), argv
        nodes.add(ours.nnodes)
    assert nodes == {1, 2}  # the multi-node launches were read as such
    with pytest.raises(ValueError, match="unrecognized option"):
        read_torchrun(["--nproc-per-nod", "2", "-m", "checker"])


# ---- the example model directories ----------------------------------------------------------------------

EXAMPLE_MODEL_DIRS = {
    # directory: (the fixture it was checked against, its architecture, keys corrected against the model)
    "Qwen3-Next-80B-A3B": ("qwen3_next_80b_a3b.json", "Qwen3NextForCausalLM", {}),
    "Qwen3.5-397B-A17B": ("qwen3_5_397b_a17b.json", "Qwen3_5MoeForConditionalGeneration", {}),
    "Kimi-Linear-48B-A3B": ("kimi_linear_48b_a3b.json", "KimiLinearForCausalLM", {}),
    "Nemotron-H-8B-Base-8K": ("nemotron_h_8b.json", "NemotronHForCausalLM", {}),
    "Falcon-H1-0.5B": ("falcon_h1_0_5b.json", "FalconH1ForCausalLM", {}),
    "granite-4.0-h-small": (
        "granite_4_0_h_small.json",
        "GraniteMoeHybridForCausalLM",
        {"intermediate_size": 768, "shared_intermediate_size": 1536},
    ),
}


def test_example_models_are_the_six_families() -> None:
    """examples/models holds one model of each family, named after it, each read by the checker; each is
    the test fixture of that family but for the keys corrected against the published model (listed in
    examples/models/README.md); and the examples that run at pp > 1 use only the families SGLang starts
    under pipeline parallelism."""
    from checker.families.geometry import load_geometry, model_architectures

    assert sorted(p.name for p in EXAMPLE_MODELS.iterdir() if p.is_dir()) == sorted(EXAMPLE_MODEL_DIRS)
    readme = (EXAMPLE_MODELS / "README.md").read_text()
    for name, (fixture, arch, corrected) in EXAMPLE_MODEL_DIRS.items():
        config = json.loads((EXAMPLE_MODELS / name / "config.json").read_text())
        expected = json.loads((REPO_ROOT / "tests" / "fixtures" / fixture).read_text())
        assert {k: v for k, v in config.items() if k not in corrected} == {
            k: v for k, v in expected.items() if k not in corrected
        }, name
        assert {k: config[k] for k in corrected} == corrected, name
        assert model_architectures(model=None, model_config=str(EXAMPLE_MODELS / name)) == (arch,)
        assert load_geometry(model=None, model_config=str(EXAMPLE_MODELS / name), tp_size=1).num_hidden_layers
        assert f"`{name}/`" in readme, name


# ---- the same examples whole: the slow group, a GPU, SGLang ---------------------------------------------


def _needing(need: str) -> list[Unit]:
    """The examples with a checker command that needs ``need`` (:data:`NEEDS`)."""
    found = []
    for unit in EXTRACTED.units:
        for line in unit.shell.replace("\\\n", " ").splitlines():
            if "checker" in line and any(n.need == need for n in needs_of(shlex.split(line, comments=True))):
                found.append(unit)
                break
    return found


def _end_to_end() -> list[Unit]:
    """The examples whose later steps read what the checker wrote (a launcher, a recipe, a block that
    reads the verdict), and those with a part the quick run leaves out (:data:`NEEDS`: slow)."""
    launches = re.compile(r"torchrun|launchers/|sbatch")
    return [u for u in EXTRACTED.units if u.checker_commands() and launches.search(u.shell)] + [
        u for u in _needing("slow") if not launches.search(u.shell)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("unit", _end_to_end(), ids=lambda u: u.id)
def test_example_runs_end_to_end(unit: Unit, tmp_path: Path) -> None:
    """The example whole, in bash, as printed: its checker commands in processes of their own (torchrun's
    world derived in one, rank 0's report written where the example says), with what needs seconds
    (:data:`NEEDS`: the plot, a CPU allocation) included; its later steps then run on what they wrote
    (read-verdict.sh on the report). It ends as its page says: 0, or failing where a command is expected
    to."""
    work, standins = make_work(tmp_path / "work"), make_standins(tmp_path / "bin")
    bash = run_bash(unit, work, standins, end_to_end=True)
    text = " ".join(unit.shell.split())
    wants = {code for (f, needle), code in EXPECTED_EXIT.items() if f == unit.file and needle in text} or {0}
    if wants == {0}:
        assert bash.code == 0, f"{unit.id}: exit {bash.code}\n{bash.out[-2000:]}\n{bash.err[-2000:]}"
    else:
        assert bash.code != 0, unit.id
    for report in work.rglob("report.json"):
        assert json.loads(report.read_text())["status"] in ("consistent", "divergent"), report


@pytest.mark.gpu
@pytest.mark.parametrize("unit", _needing("cuda"), ids=lambda u: u.id)
def test_gpu_examples_run_as_printed(unit: Unit, sandbox: tuple[Path, Path]) -> None:
    """The examples that allocate on a GPU, as printed, on this machine's GPUs (an NCCL rank's device:
    cuda:LOCAL_RANK, wrapped over the GPUs there are)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    result = run_example(unit, *sandbox, have=frozenset({"cuda", "slow"}))
    assert not result.problems, f"{unit.id}:\n" + "\n".join(result.problems)


@pytest.mark.sglang
@pytest.mark.parametrize("unit", _needing("sglang"), ids=lambda u: u.id)
def test_sglang_examples_run_as_printed(unit: Unit, sandbox: tuple[Path, Path], sglang_engine: Any) -> None:
    """The examples that run the installed SGLang's own code (``--engine sglang|both``), as printed, where
    SGLang is installed: the engine group's environments."""
    result = run_example(unit, *sandbox, have=frozenset({"sglang"}))
    assert not result.problems, f"{unit.id}:\n" + "\n".join(result.problems)
