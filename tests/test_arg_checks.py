"""Green means SGLang starts this deployment: every argument check of every modelled release is read from
its code, and each is refused as the release refuses it or listed as not modelled with the reason.

``scripts/build_arg_checks.py`` generates ``checker/core/releases/arg_checks.py`` from each release's code
(the asserts and raises of its argument handling that involve what the checker reads, and the server arguments
its pool sizing reads); ``checker/core/releases/check_policy.py`` and ``arg_policy.py`` handle each one. What
a user relies on: the issue's launches are refused in one line (exit 2) quoting the release's own words and
file:line, with a way out that starts; a flag the pool sizing reads is never parsed and ignored; a release
whose code reads differently from the table (a new wheel, a changed check) fails here until the table is
regenerated and the new check handled.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases import arg_policy, check_policy
from checker.core.releases.arg_checks import CHECKS, SIZING_READS
from checker.core.releases.arg_quote import check_message, check_site, sites, sizing_read_site
from checker.core.releases.launch_checks import LaunchFacts, check_launch
from checker.core.releases.releases import MODELLED_RELEASES

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
QWEN35 = str(FIXTURES / "qwen3_5_397b_a17b.json")
NEMOTRON = str(FIXTURES / "nemotron_h_8b.json")
WHEELS = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))
sys.path.insert(0, str(REPO / "scripts"))

import build_arg_checks  # noqa: E402

SRC = build_arg_checks.default_src()


def _serve(model: str = QWEN35) -> list[str]:
    return ["python", "-m", "sglang.launch_server", "--model-path", model]


def _one_line(res) -> str:  # noqa: ANN001 - the cli fixture's result
    assert res.rc == 2 and res.out == "", (res.rc, res.err[-400:])
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    return lines[0]


# -- every check is handled, once ---------------------------------------------------------------------------


def test_every_check_and_every_sizing_read_has_one_handling() -> None:
    """A check the generator lists without a line in check_policy.py (a new release, a changed message),
    or a line for a check the table no longer has, fails here; so does a sizing read without a line."""
    assert sorted(set(CHECKS) - set(check_policy.CHECKS)) == []
    assert sorted(set(check_policy.CHECKS) - set(CHECKS)) == []
    assert sorted(set(SIZING_READS) ^ set(arg_policy.SIZING_READS)) == []
    for name, handling in check_policy.CHECKS.items():
        assert handling.how in (arg_policy.MODELLED, arg_policy.KV, arg_policy.NOT_MODELLED), name
        if handling.how == arg_policy.NOT_MODELLED:
            assert handling.why in arg_policy.REASONS, name


def _ids_in_code() -> dict[str, set[str]]:
    """Check ids written in the checker's code, by module."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "checker").rglob("*.py"):
        if path.name in ("arg_checks.py", "check_policy.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in CHECKS:
                found.setdefault(node.value, set()).add(path.name)
    return found


def test_a_check_handled_as_refused_is_refused_by_the_code_that_says_so() -> None:
    """Every id the code refuses by is in the table and handled as modelled; every check handled as refused
    by check_launch / check_pp_spec has its id in that code (a modelled line without code fails)."""
    in_code = _ids_in_code()
    for name, modules in in_code.items():
        assert check_policy.CHECKS[name].how == arg_policy.MODELLED, (name, modules)
    refusers = {check_policy.LAUNCH: "launch_checks.py", check_policy.PP_SPEC: "startup.py"}
    for name, handling in check_policy.CHECKS.items():
        if handling in refusers:
            assert refusers[handling] in in_code.get(name, set()), name


def test_the_counts_the_docs_give_are_the_tables() -> None:
    text = (REPO / "docs" / "preflight.md").read_text()
    modelled = sum(h.how == arg_policy.MODELLED for h in check_policy.CHECKS.values())
    assert f"{len(CHECKS)} checks over the {len(MODELLED_RELEASES)} releases" in text
    assert f"`checker/core/releases/check_policy.py`: {modelled}\nmodelled" in text
    assert f"{len(SIZING_READS)} of them over the releases" in text
    releases = (REPO / "docs" / "sglang-releases.md").read_text()
    assert (
        f"({len(CHECKS)} checks, {len(SIZING_READS)} sizing reads over the {len(MODELLED_RELEASES)} releases"
        in releases
    )


def test_the_docs_list_every_check_not_modelled() -> None:
    """docs/preflight.md "Start-up refusals" holds the generated list (scripts/build_arg_checks.py --docs)."""
    text = (REPO / "docs" / "preflight.md").read_text()
    assert build_arg_checks.docs_with_list(text) == text, "run python3 scripts/build_arg_checks.py --docs"
    listed = text.split(build_arg_checks.BEGIN)[1].split(build_arg_checks.END)[0]
    not_modelled = [i for i, h in check_policy.CHECKS.items() if h.how == arg_policy.NOT_MODELLED]
    assert listed.count("\n- ") == len(not_modelled)


# -- the table is what each release's code says --------------------------------------------------------------


@functools.cache
def _release_code(version: str) -> dict[str, str]:
    wheel = next(iter(WHEELS.glob(f"sglang-{version}-*.whl")), None)
    if wheel is not None:
        return dict(build_arg_checks.wheels.python_sources(wheel))
    if (SRC / version / "sglang").is_dir():
        return dict(build_arg_checks.wheels.python_sources(SRC / version))
    pytest.skip(f"no wheel of SGLang {version} in {WHEELS} nor sources in {SRC}")


def _read_as_tabled(
    version: str, files: dict[str, str] | None = None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(checks, reads) of ``version`` as its code (``files``, default its wheel) says, in the table's
    terms: id -> sites, field -> site."""
    files = files if files is not None else _release_code(version)
    checks: dict[str, list[str]] = {}
    for f in build_arg_checks.read_release_checks(files):
        checks.setdefault(build_arg_checks.rule_id(f.key), []).append(f"{f.path}:{f.line} {f.function}")
    reads = {r.field: [f"{r.path}:{r.line} {r.function}"] for r in build_arg_checks.read_sizing(files)}
    return checks, reads


def _tabled(version: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    checks = {i: sites(e[3], version) for i, e in CHECKS.items() if sites(e[3], version)}
    reads = {f: sites(e[1], version) for f, e in SIZING_READS.items() if sites(e[1], version)}
    return checks, reads


def _assert_release_is_tabled(version: str, files: dict[str, str] | None = None) -> None:
    want_checks, want_reads = _read_as_tabled(version, files)
    got_checks, got_reads = _tabled(version)
    stale = sorted(set(want_checks) ^ set(got_checks)) + [
        i for i in want_checks if i in got_checks and sorted(want_checks[i]) != sorted(got_checks[i])
    ]
    assert not stale, f"SGLang {version}: run python3 scripts/build_arg_checks.py ({stale[:5]})"
    assert want_reads == got_reads, f"SGLang {version}: run python3 scripts/build_arg_checks.py"


def test_the_newest_release_is_what_its_wheel_says() -> None:
    """The newest modelled release, read again from its wheel by the generator's own reading: every check
    and sizing read, each at the table's file:line."""
    _assert_release_is_tabled(MODELLED_RELEASES[-1])


@pytest.mark.slow
@pytest.mark.parametrize("version", MODELLED_RELEASES[:-1])
def test_every_release_is_what_its_wheel_says(version: str) -> None:
    _assert_release_is_tabled(version)


def test_a_changed_release_fails_until_regenerated() -> None:
    """The comparison itself: a release whose code gains a check reads as stale."""
    version = MODELLED_RELEASES[-1]
    files = _release_code(version)
    path = "sglang/srt/arg_groups/validation_hook.py"
    changed = files[path].replace(
        "def check_server_args(server_args: Any):",
        "def check_server_args(server_args: Any):\n    assert server_args.pp_size < 99, 'too many stages'",
    )
    assert changed != files[path]
    with pytest.raises(AssertionError, match="run python3 scripts/build_arg_checks.py"):
        _assert_release_is_tabled(version, {**files, path: changed})


def test_the_quoted_place_holds_the_releases_words() -> None:
    """Independently of the table's reading: for every modelled check and every release that has it, the
    file:line quoted is, in that release's own source, the assert or raise whose message is quoted."""
    found = [v for v in MODELLED_RELEASES if (SRC / v / "sglang").is_dir()]
    if not found:
        pytest.skip(f"no unpacked SGLang sources in {SRC}")
    checked = 0
    for name, handling in check_policy.CHECKS.items():
        message = CHECKS[name][0]
        if handling.how != arg_policy.MODELLED or not message:
            continue
        words = re.split(r"\{[^{}]*\}", message)[0].strip()[:40]
        for v in found:
            site = check_site(name, v)
            if site is None:
                continue
            path, _, rest = site.partition(":")
            line = int(rest.split(" ")[0])
            text = (SRC / v / "sglang" / "srt" / path).read_text(encoding="utf-8", errors="replace")
            window = " ".join(text.splitlines()[line - 1 : line + 12])
            joined = re.sub(r'"\s+f?"', "", window)  # implicit string concatenation, as Python joins it
            assert words in joined, (name, v, site)
            checked += 1
    # Every release has modelled checks (the PP refusal at least): none read means the sites were lost.
    assert checked >= len(found), (checked, found)


# -- the launches -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "layout", "where", "words"),
    [
        (
            "0.5.23",
            ["--pp-size", "3", "--nnodes", "2"],
            "sglang/srt/arg_groups/validation_hook.py:179 check_server_args",
            "tp_size must be divisible by number of nodes",
        ),
        (
            "0.5.9",
            ["--pp-size", "3", "--nnodes", "2"],
            "sglang/srt/server_args.py:5132 ServerArgs.check_server_args",
            "tp_size must be divisible by number of nodes",
        ),
        (
            "0.5.23",
            ["--tp-size", "2", "--dp-size", "2", "--nnodes", "2"],
            "sglang/srt/arg_groups/validation_hook.py:199 check_server_args",
            "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across "
            "nodes",
        ),
        (
            "0.5.9",
            ["--tp-size", "2", "--dp-size", "2", "--nnodes", "2"],
            "sglang/srt/server_args.py:5143 ServerArgs.check_server_args",
            "multi-node data parallel is not supported unless dp attention!",
        ),
    ],
    ids=["nnodes-0.5.23", "nnodes-0.5.9", "dp-nodes-0.5.23", "dp-nodes-0.5.9"],
)
def test_a_layout_the_nodes_cannot_hold_is_refused(cli, release, layout, where, words) -> None:
    """The issue's --pp-size 3 --nnodes 2 and --dp-size 2 --nnodes 2 (no attention DP): one line, exit 2,
    the release's words at their file:line (0.5.23 validation_hook.py:178-181, :199-202; 0.5.9
    server_args.py:5132-5134, :5143-5145)."""
    base = ["derive", "--budget-gib", "40", "--sglang-version", release, "--", *_serve(NEMOTRON)]
    line = _one_line(cli([*base, *layout]))
    assert f'SGLang {release} refuses it at start-up ({where}: "{words}"); ' in line, line


@pytest.mark.parametrize("release", ["0.5.23", "0.5.9"])
def test_the_ways_out_of_the_node_checks_start(cli, release: str) -> None:
    base = ["derive", "--budget-gib", "40", "--sglang-version", release, "--", *_serve(NEMOTRON)]
    assert cli([*base, "--pp-size", "2", "--nnodes", "2"]).rc == 0
    ok = cli([*base, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--nnodes", "2"])
    assert ok.rc == 0, ok.err


def test_multi_layer_eagle_under_pp_is_refused(cli) -> None:
    """0.5.23 arg_groups/validation_hook.py:131-138: EAGLE, not multi-layer (SGLANG_ENABLE_PP_SPEC set)."""
    base = ["derive", "--budget-gib", "40", "--sglang-version", "0.5.23", "--", *_serve()]
    spec = ["--pp-size", "2", "--speculative-algorithm", "EAGLE"]
    env = {"SGLANG_ENABLE_PP_SPEC": "1"}
    line = _one_line(cli([*base, *spec, "--enable-multi-layer-eagle"], env=env))
    assert line.endswith(
        "--speculative-algorithm EAGLE --enable-multi-layer-eagle with --pp-size 2: SGLang 0.5.23 refuses it "
        'at start-up (sglang/srt/arg_groups/validation_hook.py:132 check_pipeline_parallel_compat: "Pipeline '
        'parallelism currently only supports EAGLE (non-multi-layer) speculative decoding"); use EAGLE (or '
        "NEXTN) without --enable-multi-layer-eagle, or --pp-size 1"
    ), line
    assert cli([*base, *spec], env=env).rc == 0
    assert (
        cli([*base, "--pp-size", "1", "--speculative-algorithm", "EAGLE", "--enable-multi-layer-eagle"]).rc
        == 0
    )


@pytest.mark.parametrize(
    ("flags", "env", "words"),
    [
        (
            ["--pp-size", "2", "--min-free-slots-delay", "4"],
            {},
            "--min-free-slots-delay is not supported with",
        ),
        (
            ["--pp-size", "2", "--speculative-algorithm", "EAGLE", "--speculative-adaptive"],
            {"SGLANG_ENABLE_PP_SPEC": "1"},
            "SGLANG_ENABLE_PP_SPEC is not compatible with --speculative-adaptive",
        ),
        (
            ["--pp-size", "2", "--speculative-algorithm", "EAGLE", "--disaggregation-mode", "prefill"],
            {"SGLANG_ENABLE_PP_SPEC": "1"},
            "SGLANG_ENABLE_PP_SPEC is not compatible with --disaggregation-mode",
        ),
        (
            ["--page-size", "16", "--chunked-prefill-size", "1000"],
            {},
            "chunked_prefill_size must be divisible by page_size",
        ),
        (
            [
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "2",
                "--speculative-num-draft-tokens",
                "6",
                "--enable-linear-replayssm-spec",
            ],
            {},
            "--enable-linear-replayssm-spec requires a linear draft chain",
        ),  # fmt: skip
        (
            [
                "--enable-linear-replayssm-spec",
                "--enable-linear-replayssm",
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-overlap-schedule",
                "--max-running-requests",
                "8",
            ],
            {},
            "--enable-linear-replayssm-spec and --enable-linear-replayssm are mutually exclusive",
        ),  # fmt: skip
        (
            ["--enable-linear-replayssm"],
            {},
            "--enable-linear-replayssm requires --mamba-radix-cache-strategy no_buffer",
        ),
        (["--enable-dp-lm-head"], {}, "--enable-dp-lm-head requires attention DP"),
        (
            ["--attn-dp-size", "2", "--dp-size", "2", "--tp-size", "2"],
            {},
            "data-parallel replicas combined with",
        ),
    ],
    ids=[
        "min-free-slots",
        "adaptive",
        "pd-node",
        "chunk-page",
        "replay-tree",
        "replay-both-rings",
        "decode-ring-buffer",
        "dp-lm-head",
        "replicas-and-attn-dp",
    ],
)
def test_the_launch_commands_other_checks_are_refused(cli, flags, env, words) -> None:
    """A flag the checker did not read before (it sized nothing) is read and checked as 0.5.23 checks it."""
    line = _one_line(cli(["derive", "--budget-gib", "40", "--", *_serve(), *flags], env=env))
    assert "SGLang 0.5.23 refuses it at start-up (sglang/srt/" in line and words in line, line


# -- each modelled launch check, on the releases that have it ------------------------------------------------

# (check, facts that fail it, the same facts with the way out taken)
LAUNCH_CASES: list[tuple[str, dict[str, object], dict[str, object]]] = [
    (
        "tp-size-must-be-divisible-by-number-of-nodes-f971ad",
        dict(pp_size=3, nnodes=2),
        dict(pp_size=4, nnodes=2),
    ),
    (
        "multi-node-data-parallel-is-not-supported-4ebc11",
        dict(tp_size=2, dp_size=2, nnodes=2),
        dict(tp_size=2, dp_size=2, nnodes=2, enable_dp_attention=True),
    ),
    (
        "multi-node-data-parallel-replicas-are-not-99088a",
        dict(tp_size=2, dp_size=2, nnodes=2),
        dict(tp_size=2, attn_dp_size=2, nnodes=2),
    ),
    (
        "dp-size-dp-size-with-attn-dp-size-attn-dp-4bb24a",
        dict(tp_size=2, dp_size=2, attn_dp_size=2),
        dict(tp_size=2, attn_dp_size=2),
    ),
    ("attn-dp-size-must-be-positive-got-attn-dp-64c6e3", dict(attn_dp_size=0), dict(attn_dp_size=1)),
    (
        "min-free-slots-delay-is-not-supported-with-831ff7",
        dict(pp_size=2, min_free_slots_delay=3),
        dict(pp_size=1, min_free_slots_delay=3),
    ),
    (
        "chunked-prefill-size-must-be-divisible-by-1800ce",
        dict(chunked_prefill_size=1000, page_size=16),
        dict(chunked_prefill_size=1024, page_size=16),
    ),
    (
        "currently-standalone-speculative-decoding-768f82",
        dict(
            speculative_algorithm="STANDALONE",
            speculative=True,
            tp_size=2,
            dp_size=2,
            enable_dp_attention=True,
        ),
        dict(speculative_algorithm="EAGLE", speculative=True, tp_size=2, dp_size=2, enable_dp_attention=True),
    ),
    (
        "please-enable-dp-attention-when-setting-25d166",
        dict(enable_dp_lm_head=True),
        dict(enable_dp_lm_head=True, tp_size=2, dp_size=2, enable_dp_attention=True),
    ),
    (
        "enable-dp-lm-head-requires-attention-dp-attn-02bac5",
        dict(enable_dp_lm_head=True),
        dict(enable_dp_lm_head=True, tp_size=2, attn_dp_size=2),
    ),
    (
        "enable-linear-replayssm-spec-requires-a-2d827d",
        dict(enable_linear_replayssm_spec=True, speculative_eagle_topk=4),
        dict(enable_linear_replayssm_spec=True),
    ),
    (
        "enable-gdn-replayssm-spec-requires-a-linear-71730c",
        dict(enable_linear_replayssm_spec=True, speculative_eagle_topk=4),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True),
    ),
    (
        "enable-linear-replayssm-spec-is-not-2a086b",
        dict(enable_linear_replayssm_spec=True, disaggregation_mode="prefill"),
        dict(enable_linear_replayssm_spec=True, disaggregation_mode="decode"),
    ),
    (
        "enable-linear-replayssm-spec-and-enable-af8c51",
        dict(enable_linear_replayssm_spec=True, enable_linear_replayssm=True, disable_radix_cache=True),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True),
    ),
    (
        "enable-linear-replayssm-requires-mamba-radix-448541",
        dict(enable_linear_replayssm=True),
        dict(
            enable_linear_replayssm=True,
            mamba_radix_cache_strategy="no_buffer",
            disable_overlap_schedule=True,
        ),
    ),
    (
        "enable-linear-replayssm-is-not-supported-7ddf3f",
        dict(enable_linear_replayssm=True, disable_radix_cache=True, disaggregation_mode="decode"),
        dict(enable_linear_replayssm=True, disable_radix_cache=True),
    ),
    (
        "linear-replayssm-cache-len-must-be-1-got-a37bc7",
        dict(enable_linear_replayssm=True, disable_radix_cache=True, linear_replayssm_cache_len=0),
        dict(enable_linear_replayssm=True, disable_radix_cache=True, linear_replayssm_cache_len=1),
    ),
    (
        "linear-replayssm-cache-len-must-be-a-power-664ead",
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, linear_replayssm_cache_len=12),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, linear_replayssm_cache_len=16),
    ),
    (
        "enable-gdn-replayssm-spec-requires-mamba-ssm-683c80",
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, mamba_ssm_dtype="bfloat16"),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, mamba_ssm_dtype="float32"),
    ),
    (
        "linear-replayssm-cache-len-must-be-2-the-3a4b5a",
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, draft_tokens=10),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True, draft_tokens=8),
    ),
    (
        "enable-gdn-replayssm-spec-is-not-yet-b518a1",
        dict(enable_linear_replayssm_spec=True),
        dict(enable_linear_replayssm_spec=True, disable_radix_cache=True),
    ),
]


@pytest.mark.parametrize(("check", "bad", "good"), LAUNCH_CASES, ids=[c for c, *_ in LAUNCH_CASES])
def test_each_launch_check_refuses_on_the_releases_that_have_it(check, bad, good) -> None:
    """On every modelled release that has the check: the failing facts are refused quoting that check at
    that release's file:line; the way out is not refused by it. A release without the check does not
    refuse with it."""
    quoted_somewhere = False
    for v in MODELLED_RELEASES:
        site = check_site(check, v)
        try:
            check_launch(LaunchFacts(release=v, **bad))  # type: ignore[arg-type]
            refused = None
        except FlagError as exc:
            refused = str(exc)
        if site is not None:
            assert refused is not None and f"(sglang/srt/{site}: " in refused, (v, refused)
            quoted_somewhere = True
            try:
                check_launch(LaunchFacts(release=v, **good))  # type: ignore[arg-type]
            except FlagError as exc:
                assert f"(sglang/srt/{site}: " not in str(exc), (v, str(exc))
        elif refused is not None:
            assert check_message(check).split("{")[0][:30] not in refused, (v, refused)
    assert quoted_somewhere, check


# -- the sizing reads: never parsed and ignored --------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "flags", "rc"),
    [
        ("0.5.23", ["--disaggregation-mode", "prefill"], 2),
        ("0.5.23", ["--disaggregation-mode", "null"], 0),  # the release's default: nothing to model
        ("0.5.23", ["--enable-hierarchical-cache"], 2),
        ("0.5.17", ["--enable-hierarchical-cache"], 0),  # 0.5.17's pool sizing does not read it
        ("0.5.23", ["--enable-memory-saver"], 0),  # read, and how the pools are allocated, not their sizes
        ("0.5.23", ["--mm-feature-transport", "cuda_ipc"], 2),
    ],
    ids=["pd-prefill", "pd-null", "hicache", "hicache-0.5.17", "memory-saver", "mm-transport"],
)
def test_a_sizing_flag_nothing_models_is_refused_where_the_sizing_reads_it(cli, release, flags, rc) -> None:
    res = cli(["derive", "--budget-gib", "40", "--sglang-version", release, "--", *_serve(), *flags])
    if rc == 0:
        assert res.rc == 0, res.err[-400:]
        return
    line = _one_line(res)
    flag = flags[0]
    name = flag[2:].replace("-", "_")
    site = sizing_read_site(name, release)
    assert site is not None and line.startswith(f"checker derive: error: launch command {flag}"), line
    assert (
        f"SGLang {release}'s pool sizing reads it ({site}), and {arg_policy.SIZING_READS[name].why}" in line
    )
    assert site.startswith("sglang/srt/mem_cache/kv_cache_configurator.py:"), site
    assert line.endswith(f"drop {flag} if the server does not need it"), line


def test_every_refused_read_is_a_flag_of_the_releases_that_read_it() -> None:
    """A refused read must be spellable: each release whose sizing reads it has the flag in its parser."""
    from checker.launch.flags import release_rows

    for name in arg_policy.REFUSED_SIZING_READS:
        flag = "--" + name.replace("_", "-")
        for v in MODELLED_RELEASES:
            if sites(SIZING_READS[name][1], v):
                spellings = {o for row in release_rows(v) for o in row[0].split()}
                assert flag in spellings, (name, v)
