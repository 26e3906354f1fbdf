"""What SGLang resolves from the speculative flags, and what it refuses at start-up from the flags under PP.

``checker/core/releases/startup.py`` holds, per release, the speculative setup the argument handling resolves
(NEXTN as EAGLE; unset steps, top-k and draft tokens picked together; draft tokens = steps + 1 at top-k
1; an unset request cap of 48) and the start-up refusals the validation makes from inputs the checker
reads (speculative decoding under PP, mixed chunked prefill under PP, a micro-batch cap of 0). What a
user relies on: a launch command with ``--speculative-algorithm EAGLE`` alone derives what the release
runs (not a deployment without speculation), and each refusal is one line, exit 2, naming the release,
SGLang's own words and a way out. The ``slow`` tests read every release's sources for the same rules.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases.releases import MODELLED_RELEASES
from checker.core.releases.startup import (
    FIRST_PP_SPEC,
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    auto_params,
    check_mixed_chunk,
    check_pp_spec,
    resolve_speculative,
    zero_micro_batch_refused,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
QWEN35 = str(FIXTURES / "qwen3_5_397b_a17b.json")
SRC = Path(os.environ.get("CHECKER_SGLANG_SRC", Path.home() / ".cache" / "pp-checker" / "src"))
SERVE = ["python", "-m", "sglang.launch_server", "--model-path", QWEN35]


def _resolve(release: str, **kw: object):
    args: dict[str, object] = dict(
        algorithm=None, steps=None, topk=None, draft_tokens=None, max_running_requests=None
    )
    args.update(kw)
    return resolve_speculative(release, **args)  # type: ignore[arg-type]


# -- the speculative setup each release resolves --------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "draft", "steps_topk"),
    [("0.5.2", 8, (5, 4)), ("0.5.7", 8, (5, 4)), ("0.5.8", 4, (3, 1)), ("0.5.23", 4, (3, 1))],
)
def test_an_algorithm_alone_gets_the_releases_own_setup(release: str, draft: int, steps_topk) -> None:
    """``auto_choose_speculative_params`` for a model in none of its lists: (5, 4, 8) up to 0.5.7, then
    (3, 1, 4), whose top-k 1 keeps draft tokens = steps + 1; an unset request cap becomes 48."""
    setup = _resolve(release, algorithm="EAGLE")
    assert (setup.algorithm, setup.draft_tokens, setup.max_running_requests) == ("EAGLE", draft, 48)
    assert auto_params(release)[:2] == steps_topk
    assert setup.note == (
        f"SGLang {release} resolves EAGLE: --max-running-requests 48, steps {steps_topk[0]}, "
        f"top-k {steps_topk[1]}, draft tokens {draft}"
    )
    given = _resolve(release, algorithm="EAGLE", max_running_requests=16)
    assert given.max_running_requests == 16 and "--max-running-requests" not in given.note


def test_nextn_is_eagle_and_standalone_picks_three_steps() -> None:
    assert _resolve("0.5.23", algorithm="nextn").algorithm == "EAGLE"
    standalone = _resolve("0.5.2", algorithm="STANDALONE")
    assert (standalone.algorithm, standalone.draft_tokens) == ("STANDALONE", 4)


def test_top_k_1_makes_the_draft_tokens_steps_plus_one() -> None:
    """SGLang: "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when
    speculative_eagle_topk
    == 1": --speculative-num-draft-tokens 8 with 3 steps at top-k 1 runs 4; at top-k 2 it runs 8."""
    one = _resolve("0.5.23", algorithm="EAGLE", steps=3, topk=1, draft_tokens=8, max_running_requests=8)
    assert (
        one.draft_tokens == 4
        and one.note == "SGLang 0.5.23 resolves EAGLE: draft tokens 4 (steps + 1 with top-k 1)"
    )
    two = _resolve("0.5.23", algorithm="EAGLE", steps=3, topk=2, draft_tokens=8, max_running_requests=8)
    assert (two.draft_tokens, two.note) == (8, "")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (
            dict(algorithm="EAGLE", topk=2),
            "without --speculative-num-steps: SGLang 0.5.23 refuses it at start-up",
        ),
        (dict(algorithm="EAGLE", steps=3), "--speculative-num-steps 3 without --speculative-eagle-topk"),
        (
            dict(algorithm="EAGLE", steps=3, topk=2),
            "--speculative-eagle-topk 2 without --speculative-num-draft-tokens",
        ),
        (dict(steps=3), "without --speculative-algorithm: SGLang runs no speculative decoding then"),
        (dict(algorithm="NGRAM"), "the checker resolves the EAGLE family's setup only"),
        (dict(algorithm="DFLASH"), "how SGLang 0.5.23 sizes DFLASH is not modelled"),
    ],
    ids=[
        "topk-without-steps",
        "steps-without-topk",
        "no-draft-tokens",
        "steps-without-algorithm",
        "ngram",
        "dflash",
    ],
)
def test_a_setup_sglang_refuses_or_the_checker_cannot_resolve_is_one_line(kw, words) -> None:
    with pytest.raises(FlagError, match=re.escape(words)):
        _resolve("0.5.23", **kw)


def test_eagle_alone_in_a_launch_command_derives_what_the_release_runs(cli) -> None:
    """The issue's case: --speculative-algorithm EAGLE alone used to derive as if speculation were off.
    At pp 1 on 0.5.23 it derives exactly what its resolved setup spelled out derives (4 draft tokens, 48
    requests), and not what no speculation derives."""
    base = ["derive", "--budget-gib", "40", "--format", "json"]
    alone = cli([*base, "--", *SERVE, "--speculative-algorithm", "EAGLE"])
    spelled = cli([*base, "--", *SERVE, *_eagle(3, 1, 4), "--max-running-requests", "48"])
    off = cli([*base, "--", *SERVE])
    assert alone.rc == spelled.rc == off.rc == 0, alone.err
    ranks = [json.loads(r.out)["ranks"] for r in (alone, spelled, off)]
    assert ranks[0] == ranks[1] != ranks[2]
    assert ranks[0][0]["intermediate_state_bytes"] > 0 == ranks[2][0]["intermediate_state_bytes"]


def _eagle(steps: int, topk: int, draft: int) -> list[str]:
    return [
        *("--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps)),
        *("--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft)),
    ]


def test_draft_tokens_without_an_algorithm_in_a_launch_command_are_refused(cli) -> None:
    """SGLang runs no speculative decoding without an algorithm; the checker's own flag alone means it
    does. Which one the user meant is theirs to say: one line, exit 2."""
    res = cli(["derive", "--", *SERVE, "--speculative-num-draft-tokens", "4"])
    assert res.rc == 2
    assert res.err.strip().endswith(
        "--speculative-num-draft-tokens 4 in the launch command without --speculative-algorithm: SGLang "
        "0.5.23 runs no speculative decoding then; add --speculative-algorithm (e.g. EAGLE) to the launch "
        "command, or drop the draft tokens"
    ), res.err
    assert (
        cli(
            [
                "derive",
                "--speculative-algorithm",
                "EAGLE",
                "--",
                *SERVE,
                "--speculative-num-draft-tokens",
                "4",
            ]
        ).rc
        == 2
    )


# -- refusals under PP ---------------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["0.5.2", "0.5.10.post1", "0.5.11", "0.5.18", "0.5.19", "0.5.20"])
def test_any_speculative_algorithm_under_pp_is_refused_up_to_0_5_20(release: str) -> None:
    for algorithm in ("EAGLE", "EAGLE3", None):
        with pytest.raises(FlagError) as exc:
            check_pp_spec(
                release,
                pp_size=2,
                algorithm=algorithm,
                speculative=True,
                pp_spec_env=True,
                attention_dp=False,
            )
        text = str(exc.value)
        where = (
            r"arg_groups/validation_hook\.py:\d+ check_server_args"
            if release in ("0.5.19", "0.5.20")
            else r"server_args\.py:\d+ ServerArgs\.check_server_args"
        )
        mixed = ", mixed chunked prefill." if release in ("0.5.2", "0.5.10.post1") else ""
        assert re.fullmatch(
            re.escape(
                f"speculative decoding with --pp-size 2: SGLang {release} refuses it at start-up (sglang/srt/"
            )
            + where
            + re.escape(
                ': "Pipeline parallelism is not compatible with overlap schedule, speculative '
                f'decoding{mixed}"); '
                "drop speculative decoding, use --pp-size 1, or SGLang 0.5.21 or later (EAGLE)"
            ),
            text,
        ), text
    check_pp_spec(
        release, pp_size=1, algorithm="EAGLE", speculative=True, pp_spec_env=False, attention_dp=False
    )


@pytest.mark.parametrize("release", ["0.5.21", "0.5.22", "0.5.23"])
def test_from_0_5_21_eagle_under_pp_starts_with_sglang_enable_pp_spec(release: str) -> None:
    """check_pipeline_parallel_compat: EAGLE only; with SGLANG_ENABLE_PP_SPEC not with attention DP;
    without it only on a prefill node, which the checker does not model."""
    assert FIRST_PP_SPEC == "0.5.21"
    check_pp_spec(
        release, pp_size=4, algorithm="EAGLE", speculative=True, pp_spec_env=True, attention_dp=False
    )
    with pytest.raises(FlagError, match="only supports EAGLE \\(non-multi-layer\\)"):
        check_pp_spec(
            release, pp_size=4, algorithm="EAGLE3", speculative=True, pp_spec_env=True, attention_dp=False
        )
    with pytest.raises(FlagError, match="is only supported on prefill nodes.*export SGLANG_ENABLE_PP_SPEC=1"):
        check_pp_spec(
            release, pp_size=4, algorithm="EAGLE", speculative=True, pp_spec_env=False, attention_dp=False
        )
    # 0.5.21 names the switch (--enable-dp-attention), 0.5.22+ the size (--attn-dp-size)
    with pytest.raises(
        FlagError, match="SGLANG_ENABLE_PP_SPEC is not compatible with (--enable-dp-attention|attention DP)"
    ):
        check_pp_spec(
            release, pp_size=4, algorithm="EAGLE", speculative=True, pp_spec_env=True, attention_dp=True
        )


def test_the_environment_reaches_the_refusal_through_the_cli(cli) -> None:
    argv = ["derive", "--model-config", QWEN35, "--pp-size", "2", "--speculative-algorithm", "NEXTN"]
    assert cli(argv).rc == 2
    assert cli(argv, env={"SGLANG_ENABLE_PP_SPEC": "1"}).rc == 0
    assert cli(argv, env={"SGLANG_ENABLE_PP_SPEC": "no"}).rc == 2  # an EnvBool: "no" is false


def test_an_unmodelled_algorithm_under_pp_gets_the_releases_start_up_refusal_first(cli) -> None:
    """SGLang refuses NGRAM under PP before it sizes anything: the user meets that refusal (and its way
    out), not the checker's "not modelled", which stays for a deployment the release would start."""
    base = ["derive", "--budget-gib", "40"]
    for release, pp, words in (
        ("0.5.20", "2", "speculative decoding with --pp-size 2: SGLang 0.5.20 refuses it at start-up"),
        (
            "0.5.23",
            "2",
            "--speculative-algorithm NGRAM with --pp-size 2: SGLang 0.5.23 refuses it at start-up",
        ),
        ("0.5.23", "1", "how SGLang 0.5.23 sizes NGRAM is not modelled"),
    ):
        res = cli(
            [
                *base,
                "--sglang-version",
                release,
                "--",
                *SERVE,
                "--pp-size",
                pp,
                "--speculative-algorithm",
                "ngram",
            ]
        )
        assert res.rc == 2, res.err
        assert words in res.err, res.err
        assert res.err.count("\n") == 1, res.err


def test_mixed_chunked_prefill_under_pp_is_refused_up_to_0_5_10_post1(cli) -> None:
    check_mixed_chunk("0.5.11", pp_size=2, enable_mixed_chunk=True, speculative=False)
    check_mixed_chunk("0.5.10.post1", pp_size=1, enable_mixed_chunk=True, speculative=False)
    with pytest.raises(FlagError) as exc:
        check_mixed_chunk("0.5.10.post1", pp_size=2, enable_mixed_chunk=True, speculative=False)
    assert re.fullmatch(
        re.escape(
            "--enable-mixed-chunk with --pp-size 2: SGLang 0.5.10.post1 refuses it at start-up (sglang/srt/"
        )
        + r"server_args\.py:\d+ ServerArgs\.check_server_args"
        + re.escape(
            ': "Pipeline parallelism is not compatible with overlap schedule, speculative decoding, mixed '
            'chunked prefill."); drop --enable-mixed-chunk or use SGLang 0.5.11 or later'
        ),
        str(exc.value),
    ), str(exc.value)
    # A launch command's switch (it sizes nothing): refused where the release refuses it, at its pp size.
    for release, pp, rc in (("0.5.10", "2", 2), ("0.5.10", "1", 0), ("0.5.11", "2", 0), ("0.5.23", "2", 0)):
        res = cli(
            ["derive", "--sglang-version", release, "--", *SERVE, "--pp-size", pp, "--enable-mixed-chunk"]
        )
        assert res.rc == rc, (release, pp, res.err)
        if rc:
            assert "--enable-mixed-chunk with --pp-size 2: SGLang 0.5.10 refuses it at start-up" in res.err


def test_every_sglang_variable_read_is_in_each_deriving_commands_help(cli) -> None:
    """SGLANG_ENABLE_PP_SPEC decides whether a deployment starts: a user must find it in --help, as the
    other variables a derivation reads."""
    from checker.core.sizing.environ import PP_SPEC_ENV, SGLANG_ENV_VARS

    for command in ("check", "derive", "plan", "sweep"):
        res = cli([command, "--help"])
        names = (*SGLANG_ENV_VARS, PP_SPEC_ENV)
        assert res.rc == 0 and all(name in res.out for name in names), (command, res.out[-600:])


def test_a_zero_micro_batch_cap_is_refused_from_0_5_11() -> None:
    assert [v for v in MODELLED_RELEASES if zero_micro_batch_refused(v)][0] == "0.5.11"


# -- the rules are what each release's code says --------------------------------------------------------


def _sources(release: str) -> str:
    root = SRC / release / "sglang" / "srt"
    files = [root / "server_args.py", *sorted((root / "arg_groups").glob("*.py"))]
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files if f.is_file())


def _releases_here() -> list[str]:
    here = [v for v in MODELLED_RELEASES if (SRC / v / "sglang" / "srt" / "server_args.py").is_file()]
    if not here:
        pytest.skip(f"no unpacked SGLang sources in {SRC}")
    return here


@pytest.mark.slow
def test_the_speculative_setup_is_what_each_releases_code_says() -> None:
    """In every release found: the last branch of auto_choose_speculative_params is auto_params', no hybrid
    class the checker reads is in its lists, NEXTN becomes EAGLE, an unset request cap becomes 48 and top-k
    1 sets the draft tokens to steps + 1."""
    from checker.core.releases.pp_support import PIPELINE

    for v in _releases_here():
        text = _sources(v)
        tree = ast.parse(text)
        auto = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name.endswith("auto_choose_speculative_params")
        )
        returns = [ast.literal_eval(r.value) for r in ast.walk(auto) if isinstance(r, ast.Return)]
        assert returns[-1] == auto_params(v), v
        assert not any(arch in ast.unparse(auto) for arch in PIPELINE), v
        assert re.search(r'==\s*"NEXTN"', text), v
        assert re.search(rf"max_running_requests\s*=\s*{SPEC_DEFAULT_MAX_RUNNING_REQUESTS}\b", text), v
        assert re.search(r"speculative_num_draft_tokens\s*=\s*\w+\.speculative_num_steps \+ 1", text), v


@pytest.mark.slow
def test_the_refusals_under_pp_are_what_each_releases_code_says() -> None:
    """In every release found: the speculative refusal's words and range, the mixed-chunk one, the
    EAGLE-only rule and SGLANG_ENABLE_PP_SPEC from 0.5.21, the micro-batch assert from 0.5.11."""
    for v in _releases_here():
        text = re.sub(r'"\s*\n\s*"', "", _sources(v))  # one string per message, as Python joins them
        refuses_all = (
            "Pipeline parallelism is not compatible with overlap schedule, speculative decoding" in text
        )
        mixed = "speculative decoding, mixed chunked prefill." in text
        eagle_only = (
            "Pipeline parallelism currently only supports EAGLE" in text and "SGLANG_ENABLE_PP_SPEC" in text
        )
        assert mixed == (v in MODELLED_RELEASES[: MODELLED_RELEASES.index("0.5.11")]), v
        # 0.5.20 refuses on every platform but NPU (its EAGLE branch): the modelled GPU answer is "refused"
        assert refuses_all == (v in MODELLED_RELEASES[: MODELLED_RELEASES.index(FIRST_PP_SPEC)]), v
        assert eagle_only == (v in MODELLED_RELEASES[MODELLED_RELEASES.index(FIRST_PP_SPEC) :]), v
        assert ("pp_max_micro_batch_size is None or" in text) == zero_micro_batch_refused(v), v
