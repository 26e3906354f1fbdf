"""One table of sizing inputs (checker/core/sizing/server_args.py): the checker's flags, the typed config, the
core's inputs and the launch-command mapping all follow from it, and the launch command's values are
checked as the checker's own flags are.

Each test names the defect it catches: a row wired into one place but not another, a value SGLang
cannot start with accepted from the launch command, a checker flag given in a spelling argparse accepts
but silently overridden by the launch command, a config file SGLang would never read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from checker.cli.main import _subparser, build_parser
from checker.cli.namespace import given_dests
from checker.config import ModelChoice, SizingFlags
from checker.core.errors import FlagError, LayoutError
from checker.core.releases.releases import choose_release
from checker.core.sizing.server_args import SIZING_ARG, SIZING_ARGS, ServerArg
from checker.preflight.resolve import capacity_inputs

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Qwen3.5: a GatedDeltaNet model whose class starts under PP (Qwen3-Next asserts a single stage).
MODEL = str(FIXTURES / "qwen3_5_397b_a17b.json")
SERVE = ["python", "-m", "sglang.launch_server", "--model-path", MODEL]


def _other_value(row: ServerArg) -> object:
    """A valid value of ``row`` other than its default (the test's input, not the code under test)."""
    if row.kind is bool:
        return True
    if row.dtype:
        return "bfloat16"
    if row.choices is not None:
        return next(c for c in reversed(row.choices) if c != row.default)
    if row.name == "kv_cache_dtype":  # a KV element type every release takes
        return "fp8_e4m3"
    if row.kind is str:  # the speculative algorithm: a name SGLang knows
        return "EAGLE"
    return 0.25 if row.kind is float else 2


def _argv(row: ServerArg, value: object) -> list[str]:
    return [row.flag] if row.kind is bool else [row.flag, str(value)]


def _parse(command: str, argv: list[str]):
    return build_parser().parse_args([command, *argv])


# -- the checker's flags and the typed config follow from the table ---------------------------------------


@pytest.mark.parametrize("command", ["check", "derive", "plan", "sweep"])
def test_flags_left_out_build_the_configs_defaults(command):
    """Every command has every sizing flag, defaulting to the typed config's default: a row missing from
    a command's parser shows as an AttributeError, a wrong argparse default as a different field."""
    required = {"plan": ["--suggest-partition"]}.get(command, [])
    args = _parse(command, required)
    policy = {"policy": None} if command == "sweep" else {}  # the sweep's --policy is a list of its own
    flags = SizingFlags.from_args(args, **policy)
    assert flags == SizingFlags(pp_size=args.pp_size)


@pytest.mark.parametrize("row", SIZING_ARGS, ids=lambda r: r.name)
def test_each_flag_sets_its_field_with_its_type(row):
    """Giving a flag sets exactly its field, typed (2, not "2"): a flag wired to another dest, or a type
    the argparse option does not apply, shows here."""
    value = _other_value(row)
    flags = SizingFlags.from_args(_parse("derive", _argv(row, value)))
    assert type(getattr(flags, row.name)) is type(value)
    assert flags == SizingFlags(**{"pp_size": 8, row.name: value})  # derive's pp default is 8


@pytest.mark.parametrize("row", SIZING_ARGS, ids=lambda r: r.name)
def test_each_flag_reaches_the_cores_inputs(row):
    """capacity_inputs carries every flag into CapacityInputs: a field dropped on the way (the
    derivation then runs with the default) shows as the default here."""
    value = _other_value(row)
    companions = {
        "speculative_num_draft_tokens": {"max_running_requests": 8},
        "speculative_num_steps": {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1},
        "speculative_eagle_topk": {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_num_draft_tokens": 8,
        },
        "token_capacity": {"context_len": 4096},
    }.get(row.name, {})
    sizing = SizingFlags(**{row.name: value, **companions})
    inputs = capacity_inputs(ModelChoice(model_config=MODEL), sizing, budget_gib=8.0, env={})
    assert getattr(inputs, row.name) == value


def test_a_list_never_lands_in_a_scalar_field():
    """The sweep's repeatable --policy is a list: it used to land in SizingFlags.policy (a str field),
    where anything reading the flag saw a list."""
    from checker.commands.sweep import config_from_args

    with pytest.raises(TypeError, match="policy"):
        SizingFlags(policy=["own-share"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="page_size"):
        SizingFlags(page_size=True)  # a bool is not a page size
    args = _parse("sweep", ["--policy", "own-share", "--policy", "max-share"])
    config = config_from_args(args)
    assert config.sizing.policy is None and config.policies == ("own-share", "max-share")


def test_the_core_refuses_what_the_flag_refuses():
    """A CapacityInputs built in code is held to the same rows as the flag: the layout sizes' error class
    and bound, a strategy that does not exist."""
    base = capacity_inputs(ModelChoice(model_config=MODEL), SizingFlags(), budget_gib=8.0, env={})
    from dataclasses import replace

    with pytest.raises(LayoutError, match="--tp-size 2000 must be at most 1,024"):
        replace(base, tp_size=2000)
    with pytest.raises(FlagError, match="--mamba-radix-cache-strategy 'lazy' is not one of"):
        replace(base, mamba_radix_cache_strategy="lazy")


# -- the launch command's values are checked as the flags are ---------------------------------------------

BAD_VALUES = [
    # (the checker's flag, the launch command's flag, a value neither SGLang nor the checker can use)
    ("--pp-size", "--pp-size", "0"),
    ("--tp-size", "--tp-size", "0"),
    ("--tp-size", "--tensor-parallel-size", "0"),
    ("--dp-size", "--dp-size", "0"),
    ("--pp-size", "--pp-size", "2000"),
    ("--page-size", "--page-size", "0"),
    ("--max-running-requests", "--max-running-requests", "0"),
    ("--max-mamba-cache-size", "--max-mamba-cache-size", "0"),
    ("--speculative-num-draft-tokens", "--speculative-num-draft-tokens", "-1"),
    ("--context-len", "--context-length", "0"),
    ("--mamba-full-memory-ratio", "--mamba-full-memory-ratio", "0"),
    ("--pp-max-micro-batch-size", "--pp-max-micro-batch-size", "-1"),
]


@pytest.mark.parametrize(("ours", "theirs", "value"), BAD_VALUES)
def test_a_value_the_flag_refuses_is_refused_in_the_launch_command(cli, ours, theirs, value):
    """Launch-command --pp-size 0 / --tp-size 0 used to be derived as 1 while --pp-size 0 was refused:
    the check then checked a deployment that does not exist. Both are one line and exit 2 now, the
    launch command's naming its own flag."""
    by_flag = cli(["derive", "--model-config", MODEL, ours, value])
    by_launch = cli(["derive", "--", *SERVE, theirs, value])
    for res in (by_flag, by_launch):
        assert res.rc == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert f"{ours} {value}" in by_flag.err
    canonical = "--tp-size" if theirs == "--tensor-parallel-size" else theirs
    assert f"launch command {canonical} {value}" in by_launch.err, by_launch.err


def test_mem_fraction_static_is_checked_alike_in_both_places(cli):
    by_flag = cli(["check", "--mem-fraction-static", "1.5", "--model", "kimi-k3", "--budget-from-device"])
    by_launch = cli(["derive", "--", *SERVE, "--mem-fraction-static", "1.5"])
    assert by_flag.rc == by_launch.rc == 2
    assert "1.5 must be in (0, 1]" in by_flag.err
    assert "launch command --mem-fraction-static 1.5" in by_launch.err


def test_a_zero_micro_batch_cap_in_the_launch_command_means_what_sglang_makes_it(cli):
    """Up to 0.5.10.post1 SGLang's scheduler reads --pp-max-micro-batch-size 0 as unset (``if not
    pp_max_micro_batch_size``: max_running_requests // pp_size); from 0.5.11 ``check_server_args``
    refuses it at start-up ("pp_max_micro_batch_size must be a positive integer or None"). The
    checker's own flag refuses 0; the launch command's gets each release's meaning."""
    argv = ["derive", "--format", "json", "--sglang-version", "0.5.10.post1", "--", *SERVE, "--pp-size", "4"]
    zero = cli([*argv, "--pp-max-micro-batch-size", "0"])
    unset = cli(argv)
    assert zero.rc == unset.rc == 0, zero.err
    assert json.loads(zero.out)["ranks"] == json.loads(unset.out)["ranks"]
    for release in ("0.5.11", "0.5.23"):
        argv = ["derive", "--sglang-version", release, "--", *SERVE, "--pp-size", "4"]
        refused = cli([*argv, "--pp-max-micro-batch-size", "0"])
        assert refused.rc == 2, refused.err
        assert re.search(
            re.escape(
                f"launch command --pp-max-micro-batch-size 0: SGLang {release} refuses it at start-up ("
            )
            + r"sglang/srt/[\w/]+\.py:\d+ [\w.]+"
            + re.escape(
                ': "pp_max_micro_batch_size must be a positive integer or None (for auto-compute). Got: 0"); '
                "leave it out for max_running_requests // pp_size, or give a positive cap"
            )
            + "$",
            refused.err.strip(),
        ), refused.err
        assert cli(argv).rc == 0
    assert cli(["derive", "--model-config", MODEL, "--pp-max-micro-batch-size", "0"]).rc == 2


# -- a checker flag given in any spelling is given ----------------------------------------------------------


@pytest.mark.parametrize("ours", [["--tp", "2"], ["--tp-s=2"], ["--tp-size", "2"], ["--tp", "1"]])
def test_an_abbreviated_checker_flag_conflicts_with_the_launch_command(cli, ours):
    """argparse accepts ``--tp 2`` for --tp-size: the merge must see it as given, or the launch
    command's --tp-size 4 silently replaces what the user typed (``--tp 1`` too: given at the default
    is still given)."""
    res = cli(["derive", *ours, "--", *SERVE, "--tp-size", "4"])
    assert res.rc == 2 and "in the launch command disagree" in res.err, res.err
    assert f"--tp-size {ours[-1].split('=')[-1]} and --tp-size 4" in res.err


def test_given_dests_is_what_argparse_set_and_leaves_the_parser_as_it_was():
    parser = build_parser()
    sub = _subparser(parser, "derive")
    words = ["--tp", "2", "--disable-radix", "--model-p=m", "--mamba-full=0.5", "-q"]
    assert given_dests(sub, words) == {
        "tp_size",
        "disable_radix_cache",
        "model_config",
        "mamba_full_memory_ratio",
        "quiet",
    }
    assert given_dests(sub, []) == set()
    args = parser.parse_args(["derive"])  # the defaults survive the suppressed parse
    assert args.tp_size == 1 and args.pp_size == 8 and args.disable_radix_cache is False


@pytest.mark.parametrize(
    ("ours", "theirs", "agree"),
    [
        ("0.5", "0.50", True),  # two spellings of one float
        ("0.5", "5e-1", True),
        ("0.5", "0.5000000000001", False),  # 1e-13 apart: a different ratio on the server
        ("0.5", "0.500001", False),
    ],
)
def test_float_conflicts_are_exact(cli, ours, theirs, agree):
    """The conflict check compares the numbers the two parsers read: a value that differs in any digit
    is a different input on the server, and the checker used to derive with its own (a 1e-12
    tolerance kept the checker's value while the server ran the launch command's)."""
    res = cli(
        ["derive", "-q", "--mamba-full-memory-ratio", ours, "--", *SERVE, "--mamba-full-memory-ratio", theirs]
    )
    if agree:
        assert res.rc == 0, res.err
    else:
        assert res.rc == 2 and "--mamba-full-memory-ratio" in res.err and "disagree" in res.err


# -- a config file SGLang would not read ------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [["--conf", "x.yaml"], ["--confi=x.yaml"]])
def test_an_abbreviated_config_flag_is_refused(cli, spelling):
    """SGLang merges a config file only for the exact word --config (prepare_server_args); argparse
    accepts --conf FILE and the server starts without the file. It used to pass the checker's --config
    refusal and be ignored here too."""
    res = cli(["derive", "--", *SERVE, *spelling])
    lines = res.err.strip().splitlines()
    assert res.rc == 2 and len(lines) == 1, res.err
    typed = spelling[0].split("=")[0]
    assert f"{typed} x.yaml in the launch command" in lines[0] and "`--config x.yaml`" in lines[0]


def test_a_config_path_holding_an_equals_sign_is_named_as_typed(cli):
    """The refusal names the flag as typed (the part before the first ``=``) and the whole path."""
    res = cli(["derive", "--", *SERVE, "--confi=runs/lr=3e-4.yaml"])
    assert res.rc == 2, res.err
    assert "--confi runs/lr=3e-4.yaml in the launch command" in res.err
    assert res.err.strip().endswith("the server would start without it")


# -- the launch command merged with the checker's flags ------------------------------------------------------


def _launch_input(res) -> str:
    assert res.rc == 0, res.err
    return json.loads(res.out)["inputs"]["launch_command"]


def test_one_model_config_named_two_ways_is_one_input(cli, tmp_path):
    """--model-config and the launch command's --model-path agree when they name the same config.json:
    a model directory, the config.json inside it, or a link to either."""
    model_dir = tmp_path / "qwen"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(Path(MODEL).read_text())
    (tmp_path / "link").symlink_to(model_dir)
    serve = ["python", "-m", "sglang.launch_server", "--model-path"]
    for ours, theirs in [
        (model_dir, model_dir / "config.json"),
        (model_dir / "config.json", model_dir),
        (tmp_path / "link", model_dir),
    ]:
        res = cli(["derive", "-q", "--model-config", str(ours), "--", *serve, str(theirs)])
        assert res.rc == 0, (ours, theirs, res.err)


def test_two_model_configs_disagree_naming_both(cli, tmp_path):
    other = tmp_path / "other.json"
    other.write_text(Path(MODEL).read_text())  # the same text in another file is still another path
    res = cli(["derive", "-q", "--model-config", str(other), "--", *SERVE])
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert f"--model-config {other} and --model-path {MODEL} in the launch command disagree" in res.err
    assert "give it in one place (the launch command is what the server runs)" in res.err


def test_nothing_after_the_separator_says_what_to_give(cli):
    res = cli(["derive", "--budget-gib", "8", "--"])
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert "nothing after --" in res.err and "-- python -m sglang.launch_server --model-path" in res.err


def test_the_launch_command_is_read_as_the_release_asked_for(cli):
    """--sglang-version picks the release whose flags read the launch command (and the report says so)."""
    for release in ("0.5.14", "0.5.23"):
        text = _launch_input(
            cli(["derive", "-q", "--format", "json", "--sglang-version", release, "--", *SERVE])
        )
        assert text.endswith(f"(read by the checker's model of SGLang {release}'s flags)"), text


def test_two_releases_with_a_launch_command_are_refused(cli):
    res = cli(["derive", "--sglang-version", "0.5.14,0.5.23", "--", *SERVE])
    assert res.rc == 2, res.err
    refusal = "--sglang-version A,B compares releases; with a launch command give one release"
    assert res.err.strip().endswith(f": {refusal}")


def test_the_launch_input_names_exactly_the_sglang_only_flags_the_command_gave(cli):
    """SGLang-only flags (no checker flag) are part of the launch input when given, so two nodes started
    with and without one differ; flags left at SGLang's default are not listed."""
    argv = ["derive", "-q", "--format", "json", "--", *SERVE, "--tp-size", "2", "--dp-size", "2"]
    given = _launch_input(cli([*argv, "--enable-dp-attention"]))
    plain = _launch_input(cli(argv))
    assert "sglang.enable_dp_attention=true" in given
    assert "sglang.enable_dp_attention" not in plain and "sglang.tp_size=2" in plain
    assert "sglang.tp_size" not in _launch_input(cli(["derive", "-q", "--format", "json", "--", *SERVE]))


def test_a_model_by_name_and_a_launch_commands_model_path_are_refused(cli):
    res = cli(["derive", "--model", "kimi-k3", "--", *SERVE])
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert f"--model kimi-k3 and --model-path {MODEL} in the launch command name two models" in res.err
    assert res.err.strip().endswith("name two models; drop --model")


@pytest.mark.parametrize(
    "ours",
    [[], ["--pp-size", "4"]],
    ids=["after-an-input-derive-does-not-use", "after-an-input-given-in-both-places"],
)
def test_every_launch_input_is_taken_whatever_comes_before_it(cli, ours):
    """The launch command's inputs are merged one by one: one the command does not use
    (--mem-fraction-static for derive) or one given in both places and agreeing must not end the merge
    for the inputs after it."""
    launch = [*SERVE, "--pp-size", "4", "--mem-fraction-static", "0.8", "--tp-size", "2"]
    res = cli(["derive", "-q", "--format", "json", *ours, "--", *launch])
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert (doc["layout"]["pp_size"], doc["layout"]["tp_size"]) == (4, 2)
    assert doc["geometry"]["name"].startswith(MODEL)


def test_derive_lays_out_attention_dp_inside_the_tp_group(cli):
    """pp 2 x SGLang's --tp-size 4 with 2-way attention DP is 8 ranks, stage 1 starting at rank 4: the
    JSON's layout and each stage's first rank count the whole TP group (they counted the attention TP
    width alone: a world of 4, stage 1 at rank 2)."""
    launch = [*SERVE, "--pp-size", "2", "--tp-size", "4", "--enable-dp-attention", "--dp-size", "2"]
    for argv in (["--", *launch], ["--pp-size", "2", "--tp-size", "2", "--dp-size", "2"]):
        res = cli(["derive", "-q", "--format", "json", *argv])
        assert res.rc == 0, res.err
        doc = json.loads(res.out)
        assert doc["layout"] == {"world_size": 8, "pp_size": 2, "tp_size": 2}
        assert [r["rank"] for r in doc["ranks"]] == [0, 4]


# -- each row refuses a value SGLang cannot start with, naming the value and the bound ----------------------

ROW_REFUSALS = [
    # (field, value, the error class a user's exit code and report follow, the one line they read)
    ("page_size", 0, FlagError, "--page-size 0 must be a positive integer"),
    ("pp_size", 1025, LayoutError, "--pp-size 1025 must be at most 1,024"),
    ("mamba_full_memory_ratio", 0.0, FlagError, "--mamba-full-memory-ratio 0.0 must be in (0, 1,000]"),
    ("mamba_full_memory_ratio", 1000.5, FlagError, "--mamba-full-memory-ratio 1000.5 must be in (0, 1,000]"),
    (
        "mamba_full_memory_ratio",
        float("nan"),
        FlagError,
        "--mamba-full-memory-ratio nan must be a finite number",
    ),
    (
        "policy",
        "max_share",
        FlagError,
        "--policy 'max_share' is not one of max-share, own-share, whole-model",
    ),
    (
        "mamba_ssm_dtype",
        "float8",
        FlagError,
        "--mamba-ssm-dtype 'float8' is not a state dtype; use one of float32, bfloat16, float16",
    ),
]


@pytest.mark.parametrize(("name", "value", "error", "line"), ROW_REFUSALS)
def test_each_row_refuses_a_bad_value_in_one_line(name, value, error, line):
    """The line a user gets for a value out of range: the flag as typed, the value, the bound (the
    parallel sizes as LayoutError, the rest as FlagError). The bounds themselves are values: pp 1024,
    a ratio of exactly 1000 and a page size of 1 are accepted."""
    with pytest.raises(error) as exc:
        SizingFlags(**{name: value})
    assert str(exc.value) == line
    SizingFlags(pp_size=1024, mamba_full_memory_ratio=1000.0, page_size=1)


def test_a_value_of_the_wrong_kind_is_a_bug_naming_the_field():
    """Parsers and the launch-command merge hand over typed values; anything else is a bug, raised as
    a TypeError naming the field and both kinds (never read as a number: True is not a page size).
    A float input takes an int, as Python does; a required field does not take None."""
    with pytest.raises(TypeError, match=r"^page_size=True is a bool, not a int$"):
        SizingFlags(page_size=True)
    with pytest.raises(TypeError, match=r"^tp_size=None is a NoneType, not a int$"):
        SizingFlags(tp_size=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^mamba_full_memory_ratio=True is a bool, not a float or None$"):
        SizingFlags(mamba_full_memory_ratio=True)
    with pytest.raises(TypeError, match=r"^disable_radix_cache=1 is a int, not a bool$"):
        SizingFlags(disable_radix_cache=1)  # type: ignore[arg-type]
    assert SizingFlags(mamba_full_memory_ratio=2).mamba_full_memory_ratio == 2


def test_a_launch_commands_value_is_read_as_sglang_reads_it():
    """A launch command's value is refused naming the launch command's own flag (--context-length, not
    the checker's --context-len); 0 is unset only where SGLang reads it so (the micro-batch cap), and
    any other cap, 1 included, is kept; a value of the wrong kind is one line, not a traceback."""
    row = SIZING_ARG
    assert row["pp_max_micro_batch_size"].launch_value(0) is None
    assert row["pp_max_micro_batch_size"].launch_value(1) == 1
    assert row["page_size"].launch_value(16) == 16
    with pytest.raises(FlagError, match=r"^launch command --context-length 0 must be a positive integer$"):
        row["context_len"].launch_value(0)
    with pytest.raises(FlagError, match=r"^launch command --page-size 0 must be a positive integer$"):
        row["page_size"].launch_value(0)
    with pytest.raises(FlagError, match=r"^launch command --page-size '16': not a int$"):
        row["page_size"].launch_value("16")
    with pytest.raises(FlagError, match=r"^launch command --pp-max-micro-batch-size False: not a int$"):
        row["pp_max_micro_batch_size"].launch_value(False)


@pytest.mark.parametrize(
    ("value", "slots"), [(None, 4), ("yes", 3), ("Y", 3), ("TRUE", 3), ("0", 4), (" 1", 4)]
)
def test_skip_decode_lock_env_reaches_the_slots_as_sglang_reads_it(value, slots):
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK is an EnvBool in SGLang (lower-cased, not stripped; yes/y count):
    set, the base slots a request holds drop from 3 to 2. Qwen3.5 at pp 8 with default flags runs
    extra_buffer without overlap: 3 + 1 = 4 slots, 2 + 1 = 3 with the variable set (0.5.23)."""
    env = {} if value is None else {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": value}
    release = choose_release("0.5.23", None)  # whatever SGLang this machine has installed
    model, flags = ModelChoice(model_config=MODEL), SizingFlags(pp_size=8)
    inputs = capacity_inputs(model, flags, budget_gib=8.0, env=env, release=release)
    assert inputs.slots_per_request() == slots


def test_a_refused_flag_shows_the_value_as_typed(cli):
    """The refusal quotes what the user typed (2e3, not 2000.0), so they find it in their command."""
    res = cli(["derive", "--model-config", MODEL, "--mamba-full-memory-ratio", "2e3"])
    assert res.rc == 2 and "--mamba-full-memory-ratio 2e3 must be in (0, 1,000]" in res.err, res.err
