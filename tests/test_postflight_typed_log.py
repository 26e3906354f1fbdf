"""The log reader on a log typed by hand from SGLang 0.5.23's own logging calls, not rendered by the
checker's format table (checker.postflight.formats): a form the table gets wrong shows here, where a
round trip through the table and the reader would hide it.

tests/fixtures/logs/sglang_0_5_23_pp2_tp2.log is a pp 2 x tp 2 start of Qwen3-Next as 0.5.23 writes it:
the scheduler's prefix ``[%(asctime)s DP.. PP.. TP..]`` (managers/scheduler.py:6279-6298,
utils/common.py:2630), ``Load weight begin./end.`` (model_executor/model_runner.py:1274, :1373-1379),
``Mamba Cache is allocated.`` (mem_cache/memory_pool.py:1004-1009) and the TP 0 summary
(managers/scheduler.py:1268-1276), among lines the reader must pass over.
"""

from __future__ import annotations

from pathlib import Path

from checker.postflight import reader as R
from checker.postflight.harvest import logged_weights

LOG = str(Path(__file__).parent / "fixtures" / "logs" / "sglang_0_5_23_pp2_tp2.log")

WEIGHTS = {
    (0, 0): ("41.09", "37.59"),
    (0, 1): ("41.09", "37.59"),
    (1, 0): ("41.33", "37.35"),
    (1, 1): ("41.33", "37.35"),
}
SUMMARY = {0: "2.91", 1: "3.05"}  # each stage's TP 0: the available memory after the pools


def _only(reading: R.LogReading, pp: int, tp: int, kind: str) -> R.Sighting:
    (one,) = reading.sightings[R.RankKey(pp=pp, tp=tp)][kind]
    assert one.complete and "0.5.23" in one.releases, one
    return one


def test_every_line_0_5_23_writes_is_read_whole_and_nothing_else() -> None:
    reading = R.read_logs([LOG])
    (stats,) = reading.logs
    assert (stats.read, stats.unknown_format, stats.cut, stats.older) == (14, 0, 0, 0)
    assert R.findings(reading) == ([], [])
    assert set(reading.sightings) == {R.RankKey(pp=p, tp=t) for p, t in WEIGHTS}
    for (pp, tp), (avail, usage) in WEIGHTS.items():
        assert _only(reading, pp, tp, "weights_begin").values == {"avail_mem": "78.68"}
        end = _only(reading, pp, tp, "weights").values
        assert (end["type"], end["avail_mem"], end["mem_usage"]) == ("Qwen3NextForCausalLM", avail, usage)
        assert _only(reading, pp, tp, "mamba").values["max_mamba_cache_size"] == "1260"
        kinds = set(reading.sightings[R.RankKey(pp=pp, tp=tp)])
        assert ("summary" in kinds) == (tp == 0), kinds  # SGLang logs it on TP 0 only
    for pp, free in SUMMARY.items():
        summary = _only(reading, pp, 0, "summary").values
        assert summary["max_total_num_tokens"] == "1843200" and summary["max_running_requests"] == "315"
        assert summary["context_len"] == "262144" and free in summary.values()


def test_weights_from_this_log_are_each_process_own_mem_usage() -> None:
    """``--weights-from-log``: one figure per (pp, tp), each its own ``mem usage=``, in rank order."""
    logged = logged_weights([LOG])
    per_rank = logged.per_rank(4, group=2)
    assert per_rank == tuple(float(WEIGHTS[(r // 2, r % 2)][1]) for r in range(4))
