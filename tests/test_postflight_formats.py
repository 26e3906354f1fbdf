"""The post-flight reads every modelled SGLang release's own log lines, in every layout's prefix.

``checker/postflight/log_formats.py`` is generated from the wheels (scripts/build_log_formats.py). What a
user relies on: a line any modelled release writes, with the prefix its scheduler builds for a pp, tp,
attention-DP, plain-DP or ep layout, is read back with the values it carries and its rank; a line cut
short gives no value rather than a wrong one; and the table says what the wheels say (re-extracted
here from the unpacked releases found on this machine, every one, under ``slow``: 30 s of parsing).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from checker.postflight import formats as F
from checker.postflight import log_formats as table
from checker.postflight.ranks import ranks_read
from checker.postflight.reader import LogReading, RankKey, read_log

REPO = Path(__file__).resolve().parent.parent
SRC = Path(os.environ.get("CHECKER_SGLANG_SRC", Path.home() / ".cache" / "pp-checker" / "src"))
RELEASES = table.RELEASES

# (name, ranks: [(dp, pp, tp, ep)], sizes, dp_is_attention)
LAYOUTS = {
    "pp4": ([(None, p, 0, 0) for p in range(4)], {"pp_size": 4}),
    "tp4": ([(None, 0, t, 0) for t in range(4)], {"tp_size": 4}),
    "pp2-tp2": ([(None, p, t, 0) for p in range(2) for t in range(2)], {"pp_size": 2, "tp_size": 2}),
    # attention DP 2 x attention TP 2: the TP number is the global one, the DP token tp // 2.
    "pp2-dp-attention": (
        [(t // 2, p, t, 0) for p in range(2) for t in range(4)],
        {"pp_size": 2, "tp_size": 4},
    ),
    "ep": ([(None, 0, t, t) for t in range(4)], {"tp_size": 4, "ep_size": 4}),
    # plain DP: two replicas, each its own TP numbering
    "dp-replicas": ([(d, 0, t, 0) for d in range(2) for t in range(2)], {"tp_size": 2}),
    "single": ([(None, 0, 0, 0)], {}),
}


def _values(i: int) -> dict[str, object]:
    return {
        "elapsed": 12.5,
        "type": "Qwen3NextForCausalLM",
        "dtype": "torch.bfloat16",
        "quant_str": "quant=fp8, fmt=e4m3, " if i % 2 else "",
        "avail_mem": 100.25,
        "mem_usage": 18.62 + i / 100,
        "max_mamba_cache_size": 70 + i,
        "conv_state_size": 0.5,
        "ssm_state_size": 2.25,
        "intermediate_ssm_state_cache_size": 1.0,
        "intermediate_conv_window_cache_size": 0.1,
        "max_total_num_tokens": 500_000 + i,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "max_running_requests": 20 + i,
        "context_len": 262144,
        "_10": "available_gpu_mem",
        "_12": 30.0,
    }


def _render(release: str, layout: str) -> tuple[str, list[tuple[RankKey, dict[str, object]]]]:
    ranks, sizes = LAYOUTS[layout]
    lines, expected = [], []
    for i, (dp, pp, tp, ep) in enumerate(ranks):
        prefix = F.prefix(release, {"DP": dp, "PP": pp, "TP": tp, "EP": ep}, sizes)
        values = _values(i)
        for kind in ("weights_begin", "weights", "mamba", "summary"):
            if kind == "summary" and tp != 0:  # only TP 0 logs it (the global TP: DP 0 under attention DP)
                continue
            for form in F.forms_of(kind, release):
                if kind == "weights" and not any(f.name == "mem_usage" for f, _ in form.fields):
                    continue
                lines.append(F.render_line(release, form.render(values), prefix_text=prefix, ms=i % 2 == 1))
                break
        expected.append((RankKey(dp=dp or 0, pp=pp, tp=tp, ep=ep), values))
    return "\n".join(lines) + "\n", expected


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("release", RELEASES)
def test_every_release_writes_lines_the_reader_reads_back(release: str, layout: str) -> None:
    """Each release's own forms and prefix rule, rendered through logging.Formatter with its own line
    format, read back: every rank by its prefix, every value it logged, and the release among those whose
    forms read its lines whole. Broken, a release's lines would be silently skipped or misread."""
    text, expected = _render(release, layout)
    reading = LogReading()
    read_log(reading, "server.log", io.BytesIO(text.encode()))
    reads = {r.key: r for r in ranks_read(reading)}
    assert sorted(reads) == sorted(k for k, _ in expected)
    mamba_logged = any(
        f.name == "max_mamba_cache_size" for form in F.forms_of("mamba", release) for f, _ in form.fields
    )
    for key, values in expected:
        read = reads[key]
        assert release in read.releases, (read.prefix, read.releases)
        assert read.weights_gib.value == pytest.approx(values["mem_usage"], abs=0.005)
        assert read.free_before_gib.value == pytest.approx(values["avail_mem"])
        assert read.weights_type == values["type"]
        if mamba_logged:
            assert read.max_mamba_cache_size.value == values["max_mamba_cache_size"]
        else:  # 0.5.2-0.5.3.post1: the pool's state sizes only
            assert read.max_mamba_cache_size.value is None and "not logged" in read.max_mamba_cache_size.note
            assert read.state_gib.value == pytest.approx(2.75)
        if read.max_running_requests.value is not None:
            assert key.tp == 0
            assert read.max_running_requests.value == values["max_running_requests"]
            assert read.max_total_num_tokens.value == values["max_total_num_tokens"]


def test_every_layouts_prefix_is_read_whatever_the_token_order() -> None:
    """0.5.2-0.5.5 write ``DP TP EP PP``, 0.5.5.post1 and later ``DP PP ATTN_CP MOE_DP TP EP``; a reader
    that assumed one order would give another process's values to a rank."""
    old = F.prefix("0.5.5", {"DP": 1, "PP": 3, "TP": 2, "EP": 1}, {"pp_size": 4, "tp_size": 4, "ep_size": 2})
    new = F.prefix(
        "0.5.5.post1", {"DP": 1, "PP": 3, "TP": 2, "EP": 1}, {"pp_size": 4, "tp_size": 4, "ep_size": 2}
    )
    assert old == " DP1 TP2 EP1 PP3" and new == " DP1 PP3 TP2 EP1"
    assert RankKey.parse(old) == RankKey.parse(new) == RankKey(dp=1, pp=3, tp=2, ep=1)
    assert F.prefix_releases(("TP", "PP"))[-1] == "0.5.5"
    assert F.prefix_releases(("PP", "TP"))[0] == "0.5.5.post1"
    # 0.5.9 adds ATTN_CP and MOE_DP between PP and TP
    both = F.prefix(
        "0.5.9",
        {"PP": 1, "ATTN_CP": 1, "MOE_DP": 1, "TP": 3},
        {"pp_size": 2, "attn_cp_size": 2, "moe_dp_size": 2, "tp_size": 4},
    )
    assert both == " PP1 ATTN_CP1 MOE_DP1 TP3" and RankKey.parse(both) == RankKey(
        pp=1, tp=3, attn_cp=1, moe_dp=1
    )
    assert RankKey.parse(" TP1 TP2") is None  # a token twice is no SGLang prefix


def test_the_drifts_between_releases_are_in_the_table() -> None:
    """The formats drift (issue 30's list, checked against the code; where the issue's wording differs
    the code is followed: the prefix order changed in 0.5.5.post1, not after 0.5.5)."""

    def releases(kind: str, has: str) -> tuple[str, ...]:
        return tuple(
            sorted({r for f in F.forms(kind) if has in f.text for r in f.releases}, key=RELEASES.index)
        )

    assert releases("weights", "{dtype}") == RELEASES[: RELEASES.index("0.5.9") + 1]  # dropped in 0.5.10
    assert min(releases("weights", "elapsed="), key=RELEASES.index) == "0.5.9"
    assert min(releases("mamba", "max_mamba_cache_size"), key=RELEASES.index) == "0.5.3.post2"
    assert min(releases("post_capture", "max_running_requests"), key=RELEASES.index) == "0.5.16"
    assert min(releases("weights", "Committed real weights"), key=RELEASES.index) == "0.5.18"
    assert F.line_format("0.5.5.post3").ms_env is None and F.line_format("0.5.6").ms_env == "SGLANG_LOG_MS"
    assert {f.config_env for f in F.line_formats()} == {"SGLANG_LOGGING_CONFIG_PATH"}
    assert [t for t, _, _ in F.prefix_rule("0.5.9")] == ["DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP"]


@pytest.mark.parametrize(
    ("cut_after", "read"),
    [
        ("mem usage=18.6", None),  # the number itself is cut: not read (18.6 is not what was logged)
        ("mem usage=18.62 G", None),  # its literal after it is cut: still not trusted
        ("mem usage=18.62 GB.", 18.62),
    ],
)
def test_a_line_cut_short_gives_no_value_rather_than_a_wrong_one(cut_after: str, read: float | None) -> None:
    line = (
        "[2026-01-01 00:00:00 PP1] Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, "
        "mem usage=18.62 GB."
    )
    text = line[: line.index(cut_after) + len(cut_after)]
    reading = LogReading()
    read_log(reading, "x.log", io.BytesIO(text.encode()))
    (got,) = ranks_read(reading)
    assert got.weights_gib.value == read
    assert (got.weights_gib.note == "cut") == (read is None)


def _extract(releases: list[str]) -> dict[str, dict[str, object]]:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import build_log_formats as build
    finally:
        sys.path.pop(0)
    return {v: build.read_release(SRC / v) for v in releases}


def _check_against_wheels(releases: list[str]) -> None:
    found = [v for v in releases if (SRC / v / "sglang").is_dir()]
    if not found:
        pytest.skip(f"no unpacked SGLang release under {SRC} (scripts/sglang_cpu_env.sh unpacks them)")
    for v, read in _extract(found).items():
        lg = read["logging"]
        assert isinstance(lg, dict)
        fmt = F.line_format(v)
        assert (lg["line"], lg["datefmt"], lg["ms_env"], lg["config_env"]) == (
            fmt.line,
            fmt.datefmt,
            fmt.ms_env,
            fmt.config_env,
        ), v
        prefix = read["prefix"]
        assert isinstance(prefix, dict) and prefix["tokens"] == F.prefix_rule(v), v
        messages = read["messages"]
        assert isinstance(messages, dict)
        for kind in F.KINDS:
            wheel = sorted(repr(tuple(segs)) for segs, _ in messages.get(kind, {}).values())
            ours = sorted(repr(segs) for segs, spans, _ in table.MESSAGES[kind] if v in F.expand(spans))
            assert wheel == ours, (v, kind)


@pytest.mark.slow
def test_the_table_says_what_every_releases_wheel_says() -> None:
    _check_against_wheels(list(RELEASES))
