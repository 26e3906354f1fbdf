"""The deployment's launch command after ``--``: forms, aliases, refusals, and the checker's flag tables
held against each release's own ``ServerArgs`` parser.

Expected values come from the command text itself (the number after ``--tp-size`` ...) and, for the
``sglang``-marked tests, from the installed release's own parser; the model-table parser (b) is compared
with SGLang's (a) on the same commands, so the stored table is checked against the release's code.
Run the ``sglang`` tests per release with ``scripts/sglang_cpu_env.sh`` (PYTHONPATH as it prints).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checker.core.errors import FlagError
from checker.launch.command import FORMS, parse_launch_command, parser_rows, split_form, tabled_releases
from checker.launch.flags import RELEASES, release_rows

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LAUNCH = ["python", "-m", "sglang.launch_server"]
# Flags no sizing reads: every deployment has some; each must be accepted without a word.
IRRELEVANT = [
    "--host",
    "0.0.0.0",
    "--port",
    "30000",
    "--trust-remote-code",
    "--served-model-name",
    "prod",
    "--log-level",
    "warning",
    "--api-key",
    "k",
    "--enable-metrics",
    "--tokenizer-mode",
    "auto",
]


def _model(tmp_path: Path, fixture: str) -> str:
    d = tmp_path / fixture.removesuffix(".json")
    d.mkdir()
    shutil.copy(FIXTURES / fixture, d / "config.json")
    return str(d)


# family fixture -> (launch arguments, the checker inputs they must give: worked from the text)
FAMILIES = {
    "qwen3_next_80b_a3b.json": (
        [
            "--pp-size",
            "8",
            "--tp-size",
            "8",
            "--mem-fraction-static",
            "0.85",
            "--mamba-radix-cache-strategy",
            "extra_buffer",
            "--page-size",
            "64",
        ],
        dict(
            pp_size=8,
            tp_size=8,
            dp_size=1,
            mem_fraction_static=0.85,
            mamba_radix_cache_strategy="extra_buffer",
            page_size=64,
        ),
    ),
    "qwen3_5_397b_a17b.json": (
        [
            "--pp-size",
            "4",
            "--tp-size",
            "8",
            "--dp-size",
            "4",
            "--enable-dp-attention",
            "--max-running-requests",
            "256",
            "--context-length",
            "131072",
        ],
        dict(pp_size=4, tp_size=2, dp_size=4, max_running_requests=256, context_len=131072),
    ),
    "kimi_linear_48b_a3b.json": (
        [
            "--pipeline-parallel-size",
            "2",
            "--tensor-parallel-size",
            "4",
            "--disable-radix-cache",
            "--max-running-requests",
            "64",
            "--mamba-ssm-dtype",
            "bfloat16",
        ],
        dict(
            pp_size=2,
            tp_size=4,
            disable_radix_cache=True,
            max_running_requests=64,
            mamba_ssm_dtype="bfloat16",
        ),
    ),
    "nemotron_h_8b.json": (
        [
            "--pp-size",
            "2",
            "--tp",
            "2",
            "--disable-overlap-schedule",
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--mamba-full-memory-ratio",
            "0.5",
        ],
        dict(
            pp_size=2,
            tp_size=2,
            disable_overlap_schedule=True,
            mamba_radix_cache_strategy="no_buffer",
            mamba_full_memory_ratio=0.5,
        ),
    ),
    "falcon_h1_0_5b.json": (
        ["--pp-size", "2", "--max-mamba-cache-size", "300", "--pp-max-micro-batch-size", "16"],
        dict(pp_size=2, tp_size=1, max_mamba_cache_size=300, pp_max_micro_batch_size=16),
    ),
    "granite_4_0_h_small.json": (
        [
            "--pp-size",
            "4",
            "--tp-size",
            "2",
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--max-running-requests",
            "32",
        ],
        dict(
            pp_size=4,
            tp_size=2,
            speculative_algorithm="EAGLE",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            max_running_requests=32,
        ),
    ),
}
FAMILY_IDS = [f.removesuffix(".json") for f in FAMILIES]
# What each command above gives, read off its text. Any of --tp-size, --dp-size, --enable-dp-attention
# gives the attention layout, which is tp_size and dp_size together (attention TP = tp // dp).
EXPLICIT = {
    "qwen3_next_80b_a3b.json": {
        "pp_size",
        "tp_size",
        "dp_size",
        "mem_fraction_static",
        "mamba_radix_cache_strategy",
        "page_size",
    },
    "qwen3_5_397b_a17b.json": {"pp_size", "tp_size", "dp_size", "max_running_requests", "context_len"},
    "kimi_linear_48b_a3b.json": {
        "pp_size",
        "tp_size",
        "dp_size",
        "disable_radix_cache",
        "max_running_requests",
        "mamba_ssm_dtype",
    },
    "nemotron_h_8b.json": {
        "pp_size",
        "tp_size",
        "dp_size",
        "disable_overlap_schedule",
        "mamba_radix_cache_strategy",
        "mamba_full_memory_ratio",
    },
    "falcon_h1_0_5b.json": {"pp_size", "max_mamba_cache_size", "pp_max_micro_batch_size"},
    "granite_4_0_h_small.json": {
        "pp_size",
        "tp_size",
        "dp_size",
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "max_running_requests",
    },
}


@pytest.mark.parametrize("fixture", list(FAMILIES), ids=FAMILY_IDS)
def test_a_realistic_command_per_family_gives_its_sizing_inputs(tmp_path: Path, fixture: str) -> None:
    args, expected = FAMILIES[fixture]
    model = _model(tmp_path, fixture)
    cmd = parse_launch_command(
        [*LAUNCH, "--model-path", model, *args, *IRRELEVANT], release="0.5.23", prefer_installed=False
    )
    assert cmd.parser == "the checker's model of SGLang 0.5.23's flags"
    assert cmd.form == FORMS[0] and cmd.release == "0.5.23"
    assert {k: cmd.values[k] for k in expected} == expected
    assert cmd.values["model_config"] == model
    # Exactly the inputs the command text gives are explicit: a default called explicit would make the
    # merge refuse a checker flag the command never contradicted; a given one left out would let the
    # checker's flag silently win.
    assert cmd.explicit == EXPLICIT[fixture] | {"model_config"}
    # The digest text names every input; a second node with one flag changed differs in that key only.
    other = parse_launch_command(
        [*LAUNCH, "--model-path", model, *args, "--max-running-requests", "7"],
        release="0.5.23",
        prefer_installed=False,
    )
    diff = {
        k
        for k in cmd.sizing_text().keys() | other.sizing_text().keys()
        if cmd.sizing_text().get(k) != other.sizing_text().get(k)
    }
    assert diff == {"max_running_requests"}


def test_defaults_are_the_releases_and_not_explicit(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen3_next_80b_a3b.json")
    cmd = parse_launch_command(["--model-path", model], release="0.5.23", prefer_installed=False)
    assert cmd.form == FORMS[2]
    assert cmd.explicit == {"model_config"}
    # 0.5.23's parser: tp/pp 1, radix and overlap on, strategy auto; page size, memory fraction and the
    # memory ratio are None there (resolved at startup), so they are not inputs of the command.
    assert cmd.values == dict(
        model_config=model,
        pp_size=1,
        tp_size=1,
        dp_size=1,
        disable_radix_cache=False,
        disable_overlap_schedule=False,
        mamba_radix_cache_strategy="auto",
        enable_linear_replayssm_spec=False,  # the ReplaySSM ring is off by default (0.5.16+)
    )
    # 0.5.14 still defaults the memory ratio to 0.9 in its parser.
    old = parse_launch_command(["--model-path", model], release="0.5.14", prefer_installed=False)
    assert old.values["mamba_full_memory_ratio"] == 0.9 and "mamba_full_memory_ratio" not in old.explicit


def test_forms_of_each_release(tmp_path: Path) -> None:
    model = _model(tmp_path, "falcon_h1_0_5b.json")
    for head in (
        ["python3", "-m", "sglang.launch_server"],
        ["/usr/bin/python3.11", "-m", "sglang.launch_server"],
    ):
        assert split_form([*head, "--pp-size", "2"], "0.5.2") == (FORMS[0], ["--pp-size", "2"])
    assert split_form(["sglang", "serve", "--pp-size", "2"], "0.5.5")[0] == FORMS[1]
    # The console script arrived in 0.5.5 (sglang/cli/main.py); 0.5.4.post3 has none.
    with pytest.raises(FlagError, match=r"0\.5\.4\.post3 has no `sglang serve`"):
        split_form(["sglang", "serve", "--pp-size", "2"], "0.5.4.post3")
    # 0.5.16's serve turns a leading positional into --model-path; 0.5.15's parser refuses it.
    cmd = parse_launch_command(
        ["sglang", "serve", model, "--pp-size", "2"], release="0.5.16", prefer_installed=False
    )
    assert cmd.values["model_config"] == model and cmd.values["pp_size"] == 2
    with pytest.raises(FlagError, match="SGLang 0.5.15 does not know"):
        parse_launch_command(
            ["sglang", "serve", model, "--model-path", model], release="0.5.15", prefer_installed=False
        )
    # 0.5.10+ serve takes --model-type out before ServerArgs parses; only the LLM server has a pool.
    cmd = parse_launch_command(
        ["sglang", "serve", "--model-type", "llm", "--model-path", model],
        release="0.5.10",
        prefer_installed=False,
    )
    assert cmd.values["model_config"] == model
    with pytest.raises(FlagError, match="only the LLM server"):
        parse_launch_command(
            ["sglang", "serve", "--model-type=diffusion", "--model-path", model],
            release="0.5.23",
            prefer_installed=False,
        )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["torchrun", "--nproc-per-node", "8"],
        ["python", "-m", "vllm.entrypoints.api_server"],
        ["sglang", "generate", "--model-path", "x"],
        ["python", "launch_server.py"],
    ],
    ids=["empty", "torchrun", "other-module", "sglang-generate", "script"],
)
def test_bad_forms_are_refused_in_one_line(argv: list[str]) -> None:
    with pytest.raises(FlagError) as info:
        parse_launch_command(argv, release="0.5.23", prefer_installed=False, check_model_path=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert "sglang" in msg


def test_aliases_and_renames_per_release(tmp_path: Path) -> None:
    model = _model(tmp_path, "nemotron_h_8b.json")

    def values(release: str, *args: str) -> dict:
        return parse_launch_command(
            ["--model-path", model, *args], release=release, prefer_installed=False
        ).values

    # --mamba-scheduler-strategy: the flag's name in 0.5.7-0.5.13.post1, a deprecated alias 0.5.14-0.5.19,
    # gone in 0.5.20 (sglang/srt/server_args.py of each release).
    assert (
        values("0.5.13", "--mamba-scheduler-strategy", "no_buffer")["mamba_radix_cache_strategy"]
        == "no_buffer"
    )
    assert (
        values("0.5.19", "--mamba-scheduler-strategy", "no_buffer")["mamba_radix_cache_strategy"]
        == "no_buffer"
    )
    with pytest.raises(FlagError, match="SGLang 0.5.20 does not know --mamba-scheduler-strategy"):
        values("0.5.20", "--mamba-scheduler-strategy", "no_buffer")
    with pytest.raises(FlagError, match="0.5.13 does not know --mamba-radix-cache-strategy"):
        values("0.5.13", "--mamba-radix-cache-strategy", "no_buffer")
    # Attention DP: --attn-dp-size (0.5.22+) and the older --dp-size N --enable-dp-attention read the same.
    new = values("0.5.23", "--tp-size", "8", "--attn-dp-size", "4")
    old = values("0.5.23", "--tp-size", "8", "--dp-size", "4", "--enable-dp-attention")
    assert (new["tp_size"], new["dp_size"]) == (old["tp_size"], old["dp_size"]) == (2, 4)
    with pytest.raises(FlagError, match="0.5.21 does not know --attn-dp-size"):
        values("0.5.21", "--tp-size", "8", "--attn-dp-size", "4")
    # --dp-size without attention DP makes replicas: each is sized with attention TP = tp, DP 1.
    assert (values("0.5.21", "--tp-size", "8", "--dp-size", "4")["tp_size"],) == (8,)
    # argparse abbreviations, as the release's parser allows them; --context-length takes 128k (0.5.10+).
    assert values("0.5.23", "--pipeline-parallel", "4", "--context-length", "128k")["pp_size"] == 4
    assert values("0.5.23", "--context-length", "128k")["context_len"] == 128_000
    with pytest.raises(FlagError, match="invalid int value: '128k'"):
        values("0.5.9", "--context-length", "128k")


def test_unknown_flags_and_bad_values_are_one_line(tmp_path: Path) -> None:
    model = _model(tmp_path, "kimi_linear_48b_a3b.json")
    with pytest.raises(FlagError) as info:
        parse_launch_command(
            [*LAUNCH, "--model-path", model, "--tp-sise", "8"], release="0.5.18", prefer_installed=False
        )
    assert str(info.value) == (
        "SGLang 0.5.18 does not know --tp-sise; did you mean --tp-size? "
        "(the checker's model of SGLang 0.5.18's flags)"
    )
    for args, fragment in [
        (["--tp-size", "eight"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'"),
        (["--mamba-ssm-dtype", "fp8"], "argument --mamba-ssm-dtype: invalid choice: 'fp8'"),
        (["--port", "1"], "the following arguments are required: --model-path/--model"),
    ]:
        base = [] if args[0] == "--port" else ["--model-path", model]
        with pytest.raises(FlagError, match=fragment.replace("(", r"\(")) as info:
            parse_launch_command([*base, *args], release="0.5.23", prefer_installed=False)
        assert "\n" not in str(info.value)
    with pytest.raises(FlagError, match="no config.json"):
        parse_launch_command(["--model-path", str(tmp_path)], release="0.5.23", prefer_installed=False)
    with pytest.raises(FlagError, match="does not read config files"):
        parse_launch_command(["--config", "x.yaml"], release="0.5.23", prefer_installed=False)
    with pytest.raises(FlagError, match="no table of that release"):
        parse_launch_command(["--model-path", model], release="0.5.1", prefer_installed=False)


def test_the_tables_cover_every_release_from_0_5_2() -> None:
    releases = tabled_releases()
    assert releases[0] == "0.5.2" and releases[-1] == "0.5.23" and len(releases) == 38
    for v in releases:
        rows = release_rows(v)
        opts = [o for row in rows for o in row[0].split()]
        assert len(opts) == len(set(opts)), v  # one action per option string, as argparse requires
        assert "--model-path" in opts and "--host" in opts and "--port" in opts


# ------------------------------------------------------------------------------------------------------
# Against the installed release's own parser (scripts/sglang_cpu_env.sh builds one per release)
# ------------------------------------------------------------------------------------------------------


def _installed_release() -> str | None:
    from checker.core.releases.releases import installed_sglang_version

    v = installed_sglang_version()
    if v is None:
        return None
    try:
        import sglang.srt.server_args  # noqa: F401
    except Exception:
        return None
    return v


INSTALLED = _installed_release()
needs_sglang = [
    pytest.mark.sglang,
    pytest.mark.skipif(INSTALLED is None, reason="sglang does not import here"),
]


@pytest.mark.sglang
@pytest.mark.skipif(INSTALLED is None, reason="sglang does not import here")
def test_the_stored_table_is_the_installed_releases_parser() -> None:
    from checker.launch.command import _own_parser

    parser, _ = _own_parser(INSTALLED)
    live = [tuple(json.loads(json.dumps(r))) for r in parser_rows(parser)]
    stored = [tuple(json.loads(json.dumps(r))) for r in release_rows(INSTALLED)]
    assert live == stored


COMMANDS = [
    *[["--model-path", "{qwen3_next_80b_a3b}", *FAMILIES[f][0], *IRRELEVANT] for f in FAMILIES],
    ["--model-path", "{nemotron_h_8b}", "--tp", "4", "--dp", "2", "--enable-dp-attention", "--pp", "2"],
    ["--model-path", "{nemotron_h_8b}", "--context-length", "32768", "--chunked-prefill-size", "4096"],
    ["--model-path", "{nemotron_h_8b}", "--mem-fraction-static", "0.8", "--max-total-tokens", "100000"],
    ["--model-path", "{nemotron_h_8b}", "--nonexistent-flag", "3"],
    ["--model-path", "{nemotron_h_8b}", "--tp-size", "two"],
    ["--model-path", "{nemotron_h_8b}", "--mamba-radix-cache-strategy", "lazy"],
    ["--model-path", "{nemotron_h_8b}", "--mamba-ssm-dtype", "float16", "--page-size", "16"],
    ["--model-path", "{nemotron_h_8b}", "--attn-dp-size", "2", "--tp-size", "4"],
    ["--model-path", "{nemotron_h_8b}", "--mamba-scheduler-strategy", "no_buffer"],
    ["--tp-size", "2"],
]


def _outcome(argv: list[str], prefer_installed: bool):
    try:
        c = parse_launch_command(argv, release=INSTALLED, prefer_installed=prefer_installed)
    except FlagError as exc:  # the same refusal from either parser, less the name of the parser
        return ("refused", re.sub(r" \((the checker's model of )?SGLang [^()]*\)$", "", str(exc)))
    return (c.values, c.explicit, c.sglang_values, c.sglang_explicit)


@pytest.mark.sglang
@pytest.mark.skipif(INSTALLED is None, reason="sglang does not import here")
@pytest.mark.parametrize("i", range(len(COMMANDS)))
def test_the_table_parser_reads_commands_as_the_releases_own_parser(tmp_path: Path, i: int) -> None:
    models = {
        f.removesuffix(".json"): _model(tmp_path, f)
        for f in ("qwen3_next_80b_a3b.json", "nemotron_h_8b.json")
    }
    argv = [a.format(**models) for a in COMMANDS[i]]
    own = _outcome(argv, prefer_installed=True)
    table = _outcome(argv, prefer_installed=False)
    if own[0] == "refused":
        assert table[0] == "refused"
        # The same refusal: the unknown flag named, or the release's own argparse message.
        assert own[1].split(": ", 1)[-1].replace("unrecognized arguments: ", "") in table[1]
    else:
        assert table == own
    parsed = parse_launch_command(argv, release=INSTALLED) if own[0] != "refused" else None
    if parsed is not None:
        assert parsed.parser == f"SGLang {INSTALLED}'s own ServerArgs parser"


def test_every_release_table_lists_releases_in_order() -> None:
    from checker.launch.command import _key

    assert list(RELEASES) == sorted(RELEASES, key=_key)


# ---- "did you mean", and a length the parse is linear in ----------------------------------------------


def test_a_mistyped_launch_flag_gets_did_you_mean_from_the_releases_own_flags(tmp_path: Path) -> None:
    """As the checker's own flags do (``--polcy`` -> ``--policy``), from the flags of the release that
    reads the command: under 0.5.13 the pool strategy is spelled --mamba-scheduler-strategy."""
    model = _model(tmp_path, "kimi_linear_48b_a3b.json")

    def refusal(release: str, *args: str) -> str:
        with pytest.raises(FlagError) as info:
            parse_launch_command(
                [*LAUNCH, "--model-path", model, *args], release=release, prefer_installed=False
            )
        return str(info.value)

    assert refusal("0.5.23", "--pp-szie", "2").startswith(
        "SGLang 0.5.23 does not know --pp-szie; did you mean --pp-size?"
    )
    old = refusal("0.5.13", "--mamba-radix-cache-strategy", "auto")
    assert "did you mean --mamba-scheduler-strategy?" in old
    assert "--mamba-radix-cache-strategy" in {o for row in release_rows("0.5.23") for o in row[0].split()}
    both = refusal("0.5.23", "--pp-szie", "2", "--tp-sise=4", "--zzzzzz")
    assert "does not know --pp-szie, --tp-sise=4, --zzzzzz; did you mean --pp-size for --pp-szie, " in both
    assert "--tp-size for --tp-sise=4?" in both
    many = refusal("0.5.23", *[f"--no-such-{i}" for i in range(3000)])
    assert "(3,000 unknown flags)" in many and len(many) < 400


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("-pp-size", "--pp-size"),
        ("--pp_size", "--pp-size"),
        ("--PP-SIZE", "--pp-size"),
        ("--tp-szie", "--tp-size"),
    ],
)
def test_the_slips_difflib_scores_poorly_get_did_you_mean_too(tmp_path: Path, typed: str, meant: str) -> None:
    """One dash (which argparse, not the flag index, reports), snake case and capitals: each names the
    release's flag it meant; a word no flag is close to gets no guess."""
    model = _model(tmp_path, "kimi_linear_48b_a3b.json")
    with pytest.raises(FlagError) as info:
        parse_launch_command(
            [*LAUNCH, "--model-path", model, typed, "2"], release="0.5.23", prefer_installed=False
        )
    assert f"does not know {typed}" in str(info.value) and f"; did you mean {meant}? (" in str(info.value)
    with pytest.raises(FlagError) as info:
        parse_launch_command(
            [*LAUNCH, "--model-path", model, "--zzzzzz"], release="0.5.23", prefer_installed=False
        )
    assert "did you mean" not in str(info.value)


def test_a_mistyped_launch_flag_through_the_cli_is_one_line(cli, tmp_path: Path) -> None:
    model = _model(tmp_path, "kimi_linear_48b_a3b.json")
    res = cli(["derive", "--budget-gib", "8", "--", *LAUNCH, "--model-path", model, "--pp-szie", "2"])
    (line,) = res.err.splitlines()
    assert res.rc == 2 and "does not know --pp-szie; did you mean --pp-size?" in line, res


def test_a_launch_command_longer_than_any_real_one_is_one_line(cli) -> None:
    """10,000 repetitions of --host x took 8.9 s in argparse before any bound was armed."""
    from checker.launch.command import MAX_LAUNCH_WORDS

    res = cli(["derive", "--budget-gib", "8", "--", *LAUNCH, "--model-path", "m", *["--host", "x"] * 10_000])
    (line,) = res.err.splitlines()
    assert res.rc == 2 and "has 20,005 words, more than any real one" in line
    assert f"reads at most {MAX_LAUNCH_WORDS:,}" in line
    # Every flag of the newest release once, with a value each, fits well inside the limit.
    assert 2 * len(release_rows(RELEASES_NEWEST)) + 8 < MAX_LAUNCH_WORDS


RELEASES_NEWEST = list(RELEASES)[-1]


def test_repeated_flags_reach_argparse_once(tmp_path: Path) -> None:
    """What makes the parse linear: a flag repeated n times is one unit by the time argparse (quadratic in
    the number of options) sees it, whatever n; the last occurrence wins, as argparse has it."""
    from checker.launch.command import table_parser
    from checker.launch.repeats import OptionIndex, collapse_repeats

    index = OptionIndex(table_parser(RELEASES_NEWEST))
    for n in (10, 1000, 20_000):
        words = ["--model-path", "m", *["--host", "x", "--hos", "y", "--enable-metrics", "--port=1"] * n]
        out = collapse_repeats(index, [*words, "--host", "last"])
        assert out == ["--model-path", "m", "--enable-metrics", "--port=1", "--host", "last"]
    model = _model(tmp_path, "kimi_linear_48b_a3b.json")
    cmd = parse_launch_command(
        [*LAUNCH, "--model-path", model, *["--pp-size", "4", "--page-size", "1"] * 900, "--pp-size", "2"],
        release=RELEASES_NEWEST,
        prefer_installed=False,
    )
    assert (cmd.values["pp_size"], cmd.values["page_size"]) == (2, 1)
    with pytest.raises(
        FlagError, match="argument --pp-size/--pipeline-parallel-size: invalid int value: 'x'"
    ):
        # a bad value among the dropped repeats is still argparse's error
        parse_launch_command(
            [*LAUNCH, "--model-path", model, "--pp-size", "x", "--pp-size", "2"],
            release=RELEASES_NEWEST,
            prefer_installed=False,
        )


# Words a launch command is made of, every kind the collapse must leave exactly as argparse reads it:
# value flags (int, str, choices), their abbreviations and --flag=value, switches (also given a value),
# list and optional-value flags, an unknown flag, the separator, values that look like flags.
_WORDS = [
    *["--pp-size", "--pp-size=3", "--tp", "--host", "--hos", "--host=h", "--mamba-ssm-dtype", "--page-size"],
    *["--enable-metrics", "--enable-metrics=1", "--disable-radix-cache", "--lora-paths", "--numa-node"],
    *["--hybrid-kvcache-ratio", "--zz", "--", "1", "2", "x", "-1", "-x", "float32", "", "a b"],
]


def _same_reading(parser, words: list[str]) -> None:
    from checker.launch.command import _ArgparseError
    from checker.launch.repeats import OptionIndex, collapse_repeats

    def outcome(args: list[str]) -> object:
        try:
            return vars(parser.parse_args(args))
        except _ArgparseError as exc:
            return str(exc)

    full = ["--model-path", "m", *words]
    assert outcome(collapse_repeats(OptionIndex(parser), full)) == outcome(full)


@settings(max_examples=300, deadline=None)
@given(words=st.lists(st.sampled_from(_WORDS), max_size=14))
def test_collapsing_repeats_never_changes_what_argparse_reads(words: list[str]) -> None:
    """The oracle is argparse itself: the collapsed command parses to the same namespace, or fails with
    the same message, as the whole command (the table parser of the newest release)."""
    _same_reading(_table_parser(), words)


@functools.cache
def _table_parser():
    from checker.launch.command import table_parser

    return table_parser(RELEASES_NEWEST)  # parse_args leaves a parser as it was: one serves every example


@pytest.mark.sglang
@pytest.mark.skipif(INSTALLED is None, reason="sglang does not import here")
@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(_WORDS), max_size=14))
def test_collapsing_repeats_never_changes_what_sglangs_own_parser_reads(words: list[str]) -> None:
    """The same with the installed release's own parser (its custom actions are left to argparse)."""
    _same_reading(_own_release_parser(), words)


@functools.cache
def _own_release_parser():
    from checker.launch.command import _own_parser

    return _own_parser(INSTALLED)[0]
