"""One cause at a time: ranks 2-3 of 4 differ from ranks 0-1 in exactly one input the user can change,
and the verdict names that input and nothing else.

Each rank is built as a node builds it (in-process, no process group): its own command line through the
real parser and the launch-command merge (``config_from_args``), its own environment, its own installed
SGLang (a dist-info on ``sys.path``), then ``derive_row`` and the wire's round trip, and ``decide`` on
the four rows, as rank 0 does after the all-gather. The cases come from the code's own tables (every
input of ``INPUT_NAMES``, every launch-command flag of ``LAUNCH_ARGS`` and every SGLang-only field
the launch command records): a new input without a case fails ``test_every_compared_input_has_a_case``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from checker.core.releases.releases import _installed_on_sys_path
from checker.core.sizing.environ import SGLANG_ENV_VARS
from checker.core.sizing.row import ATTENTION_LAYOUT, INPUT_NAMES
from checker.core.sizing.server_args import LAUNCH_ARGS, SIZING_FLAG_NAMES
from checker.distributed.launch_env import RankEnv
from checker.distributed.wire import decode_row, encode_row
from checker.preflight import derivation
from checker.preflight.verdict import Verdict, decide

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KIMI = ["--model", "kimi-k3"]
BASE = [*KIMI, "--budget-gib", "8", "--pp-size", "4"]
SERVE = ["python", "-m", "sglang.launch_server"]


@dataclass(frozen=True)
class Node:
    """How one node starts its ranks: the checker's flags, the launch command after ``--`` (None: none),
    the environment, the installed SGLang (None: none), and what a node's own files or build hold."""

    argv: tuple[str, ...] = tuple(BASE)
    launch: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    installed: str | None = None
    model_json: str | None = None
    """The content of the model's config.json on this node (the path is the same on every node)."""
    torch_version: str = "2.13.0"
    checker_version: str | None = None


@dataclass(frozen=True)
class Case:
    expected: str
    """The one input the verdict must name."""
    same: Node
    """Ranks 0-1."""
    odd: Node
    """Ranks 2-3."""
    covers: tuple[str, ...] = field(default=())
    """The table entries this case covers (default: the input it expects)."""


def _env(rank: int) -> RankEnv:
    return RankEnv(
        rank=rank,
        world_size=4,
        local_rank=rank % 2,
        local_world_size=2,
        node_rank=rank // 2,
        host=f"node-{rank // 2}",
        master_addr=None,
        master_port=None,
        use_agent_store=False,
        restart_count=0,
        max_restarts=0,
    )


def _rank_row(node: Node, rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from checker.cli.main import _subparser, build_parser, join_negative_values, with_default_command
    from checker.cli.namespace import apply_launch_command, given_dests
    from checker.commands.check_config import config_from_args

    with monkeypatch.context() as m:
        if node.installed is not None:
            site = tmp_path / f"site-{node.installed}"
            info = site / f"sglang-{node.installed}.dist-info"
            info.mkdir(parents=True, exist_ok=True)
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: sglang\nVersion: {node.installed}\n"
            )
            m.syspath_prepend(str(site))
        if node.checker_version is not None:
            m.setattr(derivation, "__version__", node.checker_version)
        for name, value in node.env:  # the node's environment, as its launch command is read in it
            m.setenv(name, value)
        if node.model_json is not None:
            (tmp_path / "model").mkdir(exist_ok=True)
            (tmp_path / "model" / "config.json").write_text(node.model_json)
        _installed_on_sys_path.cache_clear()
        try:
            words = join_negative_values(with_default_command(list(node.argv)))
            parser = build_parser()
            args = parser.parse_args(words)
            args.launch = None
            args.given = given_dests(_subparser(parser, "check"), words[1:])  # as main records it
            if node.launch is not None:
                args, args.launch = apply_launch_command(args, list(node.launch), given=args.given)
            env = _env(rank)
            config = config_from_args(args, env)
            facts = derivation.local_facts(config, env, None)
            row = derivation.derive_row(
                config,
                env,
                facts,
                all_free=[facts.device_free_bytes] * 4,
                torch_version=node.torch_version,
                device=None,
                environ=dict(node.env),
            )
        finally:
            _installed_on_sys_path.cache_clear()
    return decode_row(encode_row(row))


def verdict_of(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Verdict:
    return decide(rows_of(case, tmp_path, monkeypatch), world_size=4)


def rows_of(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    return [_rank_row(case.same if r < 2 else case.odd, r, tmp_path, monkeypatch) for r in range(4)]


# -- the cases ------------------------------------------------------------------------------------------

KIMI_LINEAR = (FIXTURES / "kimi_linear_48b_a3b.json").read_text()

# Another value of each of the checker's sizing flags, valid on its own with BASE (kimi-k3, pp 4, 8 GiB).
FLAG_CHANGE: dict[str, list[str]] = {
    "pp_size": ["--pp-size", "2"],  # world 4 is not 2 x 1: an error on ranks 2-3, and still this input
    "tp_size": ["--tp-size", "2"],
    "dp_size": ["--dp-size", "2"],
    "policy": ["--policy", "whole-model"],
    "mamba_full_memory_ratio": ["--mamba-full-memory-ratio", "0.5"],
    "mamba_radix_cache_strategy": ["--mamba-radix-cache-strategy", "extra_buffer"],
    "page_size": ["--page-size", "64"],
    "disable_radix_cache": ["--disable-radix-cache"],
    "disable_overlap_schedule": ["--disable-overlap-schedule"],
    "max_running_requests": ["--max-running-requests", "8"],
    "max_mamba_cache_size": ["--max-mamba-cache-size", "40"],
    "pp_max_micro_batch_size": ["--pp-max-micro-batch-size", "1"],
    "speculative_num_draft_tokens": ["--speculative-num-draft-tokens", "4"],
    "speculative_algorithm": ["--speculative-algorithm", "EAGLE"],
    "speculative_num_steps": ["--speculative-num-steps", "5"],
    "speculative_eagle_topk": ["--speculative-eagle-topk", "2"],
    "mamba_ssm_dtype": ["--mamba-ssm-dtype", "bfloat16"],
    "enable_linear_replayssm_spec": ["--enable-linear-replayssm-spec"],
    "linear_replayssm_cache_len": ["--linear-replayssm-cache-len", "8"],
    "token_capacity": ["--token-capacity", "100000"],
    "context_len": ["--context-len", "2048"],
    "kv_cache_dtype": ["--kv-cache-dtype", "fp8_e4m3"],
    "max_total_tokens": ["--max-total-tokens", "100000"],
    "attention_backend": ["--attention-backend", "flashmla"],  # kimi-k3 is MLA: it forces page 64
    "decode_attention_backend": ["--decode-attention-backend", "flashmla"],
    "prefill_attention_backend": ["--prefill-attention-backend", "fa3"],
    "speculative_draft_attention_backend": ["--speculative-draft-attention-backend", "fa3"],
}
# What a flag needs beside it on every rank (so that only the flag differs).
_EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
FLAG_NEEDS: dict[str, list[str]] = {
    "speculative_num_draft_tokens": ["--max-running-requests", "8"],
    "speculative_num_steps": _EAGLE,
    "speculative_eagle_topk": [*_EAGLE, "--speculative-num-draft-tokens", "8"],
    "linear_replayssm_cache_len": ["--enable-linear-replayssm-spec"],  # the ring's length, where it is on
}
PP_SPEC = (("SGLANG_ENABLE_PP_SPEC", "1"),)
"""Every node of a speculative case exports it: SGLang 0.5.23 starts speculative decoding under PP only
with it (checker/core/releases/startup.py check_pp_spec)."""
ENV_CHANGE = {
    "SGLANG_PP_LAYER_PARTITION": "24,23,23,23",
    "SGLANG_MAMBA_CONV_DTYPE": "float32",
    "SGLANG_MAMBA_SSM_DTYPE": "bfloat16",
    "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1",
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
}

ATTENTION_FLAGS = ("tp_size", "dp_size")

MODEL = ("--model-path", "{model}")
# A launch command's flag (by the checker's name: LAUNCH_ARGS) -> its other value, and the input it is
# compared as. The model's config.json is another file on ranks 2-3 (same content elsewhere), see below.
LAUNCH_CHANGE: dict[str, tuple[list[str], str]] = {
    "pp_size": (["--pp-size", "2"], "pp_size"),
    "tp_size": (["--tp-size", "2"], "attention_layout"),
    # Attention DP 2 over the same --tp-size 2: attention TP 1. Both sizes the rank derives with change;
    # what is named is the flags as typed (attention_layout), not the two sizes nobody typed.
    "dp_size": (["--attn-dp-size", "2"], "attention_layout"),
    "mamba_full_memory_ratio": (["--mamba-full-memory-ratio", "0.5"], "mamba_full_memory_ratio"),
    "mamba_radix_cache_strategy": (
        ["--mamba-radix-cache-strategy", "extra_buffer"], "mamba_radix_cache_strategy"
    ),
    "page_size": (["--page-size", "64"], "page_size"),
    "disable_radix_cache": (["--disable-radix-cache"], "disable_radix_cache"),
    "disable_overlap_schedule": (["--disable-overlap-schedule"], "disable_overlap_schedule"),
    "max_running_requests": (["--max-running-requests", "8"], "max_running_requests"),
    "max_mamba_cache_size": (["--max-mamba-cache-size", "40"], "max_mamba_cache_size"),
    "pp_max_micro_batch_size": (["--pp-max-micro-batch-size", "1"], "pp_max_micro_batch_size"),
    "speculative_num_draft_tokens": (["--speculative-num-draft-tokens", "4"], "speculative_num_draft_tokens"),
    "speculative_algorithm": (["--speculative-algorithm", "NEXTN"], "speculative_algorithm"),
    "speculative_num_steps": (["--speculative-num-steps", "5"], "speculative_num_steps"),
    "speculative_eagle_topk": (["--speculative-eagle-topk", "2"], "speculative_eagle_topk"),
    "mamba_ssm_dtype": (["--mamba-ssm-dtype", "bfloat16"], "mamba_ssm_dtype"),
    "enable_linear_replayssm_spec": (["--enable-linear-replayssm-spec"], "enable_linear_replayssm_spec"),
    "linear_replayssm_cache_len": (["--linear-replayssm-cache-len", "8"], "linear_replayssm_cache_len"),
    "context_len": (["--context-length", "2048"], "context_len"),
    "kv_cache_dtype": (["--kv-cache-dtype", "fp8_e4m3"], "kv_cache_dtype"),
    "max_total_tokens": (["--max-total-tokens", "100000"], "max_total_tokens"),
    "attention_backend": (["--attention-backend", "flashmla"], "attention_backend"),
    "decode_attention_backend": (["--decode-attention-backend", "flashmla"], "decode_attention_backend"),
    "prefill_attention_backend": (["--prefill-attention-backend", "fa3"], "prefill_attention_backend"),
    "speculative_draft_attention_backend": (
        ["--speculative-draft-attention-backend", "fa3"],
        "speculative_draft_attention_backend",
    ),
    "mem_fraction_static": (["--mem-fraction-static", "0.8"], "launch_command"),
    "model_config": ([], "model"),
}  # fmt: skip
# SGLang-only fields the launch command records (compared inside the launch_command input).
LAUNCH_ONLY_CHANGE = {
    "chunked_prefill_size": ["--chunked-prefill-size", "4096"],
    "max_prefill_tokens": ["--max-prefill-tokens", "8192"],
    "mamba_track_interval": ["--mamba-track-interval", "128"],
    "enable_mixed_chunk": ["--enable-mixed-chunk"],  # a start-up refusal's switch, sizes nothing
}


def _cases(tmp: str) -> dict[str, Case]:
    model_dir = f"{tmp}/model"
    cases: dict[str, Case] = {}
    for name, words in FLAG_CHANGE.items():
        need = FLAG_NEEDS.get(name, [])
        # --tp-size and --dp-size are named as typed (attention_layout), not as the sizes derived from them.
        expected = ATTENTION_LAYOUT if name in ATTENTION_FLAGS else name
        env = PP_SPEC if name.startswith("speculative") else ()
        cases[f"flag {name}"] = Case(
            expected,
            Node(argv=(*BASE, *need), env=env),
            Node(argv=(*BASE, *need, *words), env=env),
            covers=(name, expected),
        )
    for name, value in ENV_CHANGE.items():
        cases[f"env {name}"] = Case(name, Node(), Node(env=((name, value),)))
    cases["installed release"] = Case("sglang_installed", Node(installed="0.5.23"), Node(installed="0.5.16"))
    cases["--sglang-version"] = Case("derived_as", Node(), Node(argv=(*BASE, "--sglang-version", "0.5.16")))
    cases["budget"] = Case("budget_gib", Node(), Node(argv=(*KIMI, "--budget-gib", "9", "--pp-size", "4")))
    device = (*KIMI, "--pp-size", "4", "--budget-from-device", "--device-free-gib", "10")
    cases["budget source"] = Case(
        "budget_source",
        Node(argv=(*device, "--mem-fraction-static", "0.9")),
        Node(argv=(*device, "--mem-fraction-static", "0.8")),
    )
    cases["model file"] = Case(
        "model",
        Node(argv=("--model-config", model_dir, "--budget-gib", "8"), model_json=KIMI_LINEAR),
        Node(
            argv=("--model-config", model_dir, "--budget-gib", "8"),
            model_json=json.dumps({**json.loads(KIMI_LINEAR), "num_nextn_predict_layers": 1}),
        ),
    )
    cases["checker version"] = Case("checker_version", Node(), Node(checker_version="0.0.9"))
    cases["torch version"] = Case("torch_version", Node(), Node(torch_version="2.12.0"))
    launch_base = (*SERVE, "--model-path", model_dir, "--pp-size", "4")
    checker = ("--budget-gib", "8")
    cases["launch command given or not"] = Case(
        "launch_command",
        Node(argv=checker, launch=launch_base, model_json=KIMI_LINEAR),
        Node(argv=("--model-config", model_dir, *checker, "--pp-size", "4"), model_json=KIMI_LINEAR),
    )
    for name, (words, expected) in LAUNCH_CHANGE.items():
        base = launch_base
        if name in ("pp_size", "tp_size"):  # ranks 2-3 change the layout alone
            base = (*SERVE, "--model-path", model_dir)
        elif name == "dp_size":
            base = (*SERVE, "--model-path", model_dir, "--tp-size", "2")
        elif name in ("speculative_num_draft_tokens", "speculative_num_steps"):  # what it needs, everywhere
            base = (*launch_base, *_EAGLE, "--max-running-requests", "8")
        elif name == "speculative_eagle_topk":
            base = (*launch_base, *_EAGLE, "--speculative-num-draft-tokens", "8")
        elif name == "speculative_algorithm":  # EAGLE on ranks 0-1, its alias NEXTN on ranks 2-3
            base = (*launch_base, "--speculative-algorithm", "EAGLE")
        elif name == "linear_replayssm_cache_len":  # the ring on everywhere, its length changed
            base = (*launch_base, "--enable-linear-replayssm-spec")
        env = PP_SPEC if name.startswith("speculative") else ()
        odd_json = KIMI_LINEAR
        if name == "model_config":  # the same path, another file on ranks 2-3
            odd_json = json.dumps({**json.loads(KIMI_LINEAR), "num_nextn_predict_layers": 1})
        cases[f"launch {name}"] = Case(
            expected,
            Node(argv=checker, launch=base, model_json=KIMI_LINEAR, env=env),
            Node(argv=checker, launch=(*base, *words), model_json=odd_json, env=env),
            covers=(f"launch {name}", expected),
        )
    for name, words in LAUNCH_ONLY_CHANGE.items():
        cases[f"launch-only {name}"] = Case(
            "launch_command",
            Node(argv=checker, launch=launch_base, model_json=KIMI_LINEAR),
            Node(argv=checker, launch=(*launch_base, *words), model_json=KIMI_LINEAR),
            covers=(f"launch-only {name}",),
        )
    return cases


CASE_IDS = list(_cases("/tmp"))


def test_every_compared_input_has_a_case() -> None:
    """The code's own tables, not a list kept here: every compared input, every sizing flag, every env
    var, every launch-command input has a case below."""
    covered = {c for case in _cases("/tmp").values() for c in (case.covers or (case.expected,))}
    wanted = {
        *INPUT_NAMES,
        *SIZING_FLAG_NAMES,
        *SGLANG_ENV_VARS,
        *(f"launch {name}" for name in LAUNCH_ARGS),
    }
    # A flag the checker has but no launch command gives (the checker's own what-if flags) is covered
    # by its checker-flag case only.
    wanted -= {f"launch {n}" for n in ("policy", "token_capacity")}
    assert wanted <= covered, sorted(wanted - covered)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_one_input_changed_on_ranks_2_3_is_the_one_named(case_id: str, tmp_path, monkeypatch) -> None:
    case = _cases(str(tmp_path))[case_id]
    rows = rows_of(case, tmp_path, monkeypatch)
    v = decide(rows, world_size=4)
    detail = (v.status, v.differing_inputs, v.root_causes, v.errors)
    expected = [case.expected]
    assert v.differing_inputs == expected, detail
    assert len(v.input_causes) == len(expected), detail
    for name, cause in zip(expected, v.input_causes, strict=True):
        assert cause.startswith(f"{name}: "), detail
        assert "ranks 2-3" in cause and "ranks 0-1" in cause, cause
    # Where the stages no longer tile one model (another partition, another config.json), each fault
    # names that same input as what made it, and the verdict is divergent whatever the values say.
    for fault in v.pipeline:
        assert fault.inputs == expected, detail
    if v.pipeline:
        assert v.status == "divergent", detail
    # Every line of every rendering of it is true as written (tests/test_output_words.py).
    from test_output_words import problems, rendered

    bad = problems(rendered(case, rows, v))
    assert not bad, "\n".join(map(str, bad))


# -- empty is not unset; the smaller group is the odd one ------------------------------------------------


@pytest.mark.parametrize("name", SGLANG_ENV_VARS)
def test_an_env_var_set_empty_differs_from_unset(name: str, tmp_path, monkeypatch) -> None:
    """SGLang tells an env var set to "" from one that is unset (``os.environ.get`` returns "" for the
    first): ranks 2-3 export it empty, ranks 0-1 do not have it. The digests differ and the root cause
    quotes the empty value, so the reader sees which nodes set it."""
    v = verdict_of(Case(name, Node(), Node(env=((name, ""),))), tmp_path, monkeypatch)
    assert v.differing_inputs == [name], (v.differing_inputs, v.root_causes, v.errors)
    assert v.root_causes == [f"{name}: ranks 0-1 leave it unset; ranks 2-3 set {name}='' (on node-1)"]


def test_one_rank_against_three_is_the_odd_one_with_its_host(tmp_path, monkeypatch) -> None:
    """Rank 3 alone exports the partition (3 ranks against 1): named after the three, with its host."""
    rows = [
        _rank_row(
            Node(env=(("SGLANG_PP_LAYER_PARTITION", "24,23,23,23"),)) if r == 3 else Node(),
            r,
            tmp_path,
            monkeypatch,
        )
        for r in range(4)
    ]
    v = decide(rows, world_size=4)
    assert v.root_causes == [
        "pipeline: layer 69 is on no stage: rank 2 holds [46, 69) (pp_rank 2), rank 3 holds [70, 93) "
        "(pp_rank 3); these ranks differ in SGLANG_PP_LAYER_PARTITION",
        "SGLANG_PP_LAYER_PARTITION: ranks 0-2 leave it unset; rank 3 sets "
        "SGLANG_PP_LAYER_PARTITION=24,23,23,23 (on node-1)",
    ]


# -- every spelling argparse accepts is a flag given -------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "launch", "message"),
    [
        (["--tp", "2"], ["--tp-size", "4"], "--tp-size 2 and --tp-size 4 in the launch command disagree"),
        (["--tp-size=2"], ["--tp-size", "4"], "--tp-size 2 and --tp-size 4 in the launch command disagree"),
        (["--tp=2"], ["--tp-size", "4"], "--tp-size 2 and --tp-size 4 in the launch command disagree"),
        (
            ["--max-running", "8"],
            ["--max-running-requests", "16"],
            "--max-running-requests 8 and --max-running-requests 16 in the launch command disagree",
        ),
        (
            ["--page=64"],
            ["--page-size", "16"],
            "--page-size 64 and --page-size 16 in the launch command disagree",
        ),
    ],
)
def test_an_abbreviated_checker_flag_is_given(ours, launch, message, capsys) -> None:
    """``--tp 2`` is ``--tp-size 2`` to argparse: the launch command's other value is a conflict (exit 2,
    one line), never silently taking the launch command's."""
    from checker.cli.main import main

    model = str(FIXTURES / "launch-model")
    code = main(["derive", *ours, "--", *SERVE, "--model-path", model, *launch])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert message in err[0], err


# -- end to end under torchrun ----------------------------------------------------------------------------

WRAPPER = """\
import os, sys
name, _, value = os.environ.get("TEST_SET_ENV_RANK_" + os.environ["RANK"], "").partition("=")
if name:
    os.environ[name] = value  # this rank's node exports it (possibly empty)
from checker.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "value"), [("SGLANG_MAMBA_SSM_DTYPE", "bfloat16"), ("SGLANG_MAMBA_CONV_DTYPE", "")]
)
def test_torchrun_an_env_var_on_ranks_2_3_is_the_one_cause(name: str, value: str, tmp_path) -> None:
    """A real 4-rank torchrun job where the node of ranks 2-3 exports one state-dtype variable: the report
    names that variable alone (not the model, whose files are the same), with the value as set."""
    import os
    import subprocess

    wrapper = tmp_path / "rank_wrapper.py"
    wrapper.write_text(WRAPPER)
    report = tmp_path / "report.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "--max-restarts", "0", str(wrapper), *BASE, "--timeout-s", "60", "--report", str(report),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in SGLANG_ENV_VARS:
        env.pop(k, None)
    env.update({f"TEST_SET_ENV_RANK_{r}": f"{name}={value}" for r in (2, 3)})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert report.exists(), proc.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["differing_inputs"] == [name], rep["root_causes"]
    shown = value or "''"
    host = rep["ranks"][2]["host"]
    assert rep["root_causes"] == [
        f"{name}: ranks 0-1 leave it unset; ranks 2-3 set {name}={shown} (on {host})"
    ]
    assert [r["inputs"]["model"] for r in rep["ranks"]].count(rep["ranks"][0]["inputs"]["model"]) == 4
