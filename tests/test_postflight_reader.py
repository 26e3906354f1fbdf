"""The post-flight reads real-world logs: wrapped, interleaved, cut, noisy, compressed, huge.

Each test wraps a log rendered from SGLang's own format strings (tests/postflight_logs.py) the way
logs arrive in practice and holds it to the preflight's prediction through the CLI in-process: what a
user relies on is that the verdict is the same as for the clean log (consistent, exit 0), or that a
log the checker cannot read is one line and exit 2, never a traceback or a silent pass.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path

import pytest
from postflight_logs import ServerLog, preflight_report

from checker.postflight import reader as R
from checker.postflight.ranks import ranks_read

N = 8  # pp 4 x tp 2 on 4 nodes


@pytest.fixture(scope="module")
def report() -> dict:
    return preflight_report(N, sizing={"tp_size": 2})


@pytest.fixture
def files(tmp_path: Path, report: dict):
    path = tmp_path / "preflight.json"
    path.write_text(json.dumps(report))

    def write(name: str, data: str | bytes) -> str:
        p = tmp_path / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    return str(path), write


def _postflight(cli, report_path: str, *logs: str, extra: tuple[str, ...] = ()):
    return cli(["postflight", "--report", report_path, *logs, "--format", "json", *extra])


def _ok(r) -> dict:
    assert r.rc == 0, (r.err, r.out[-2000:])
    doc = json.loads(r.out)
    assert doc["status"] == "consistent" and len(doc["ranks"]) == N, doc
    return doc


def _wrap(text: str, fn) -> str:
    return "".join(fn(line) + "\n" for line in text.splitlines())


WRAPPINGS = {
    "container-runtime": lambda line: f"2026-01-01T10:00:00.123456789+02:00 stderr F {line}",
    "kubectl-timestamps": lambda line: f"2026-01-01T08:00:00.000000000Z {line}",
    "notebook-indent": lambda line: f"    {line}",
    "progress-bar-before": lambda line: (
        f"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]\r{line}"
    ),
    "progress-bar-after": lambda line: f"{line}\rCapturing batches (bs=4):  40%|####      | 2/5",
    "crlf": lambda line: f"{line}\r",
    "docker-json": lambda line: json.dumps(
        {"log": line + "\n", "stream": "stderr", "time": "2026-01-01T10:00:00Z"}
    ),
}


@pytest.mark.parametrize("how", WRAPPINGS)
def test_wrapped_lines_read_as_the_bare_ones(cli, files, report, how):
    path, write = files
    _ok(_postflight(cli, path, write("server.log", _wrap(ServerLog(report).text(), WRAPPINGS[how]))))


def test_several_nodes_logs_concatenated_interleaved_and_out_of_order(cli, files, report):
    """Each node's log alone, then all of them shuffled line by line into one: ranks are found by their
    prefix wherever their lines are."""
    path, write = files
    log = ServerLog(report)
    nodes = [write(f"node{n}.log", log.text(ranks=[2 * n, 2 * n + 1])) for n in range(4)]
    _ok(_postflight(cli, path, *nodes))
    lines = log.text().splitlines()
    random.Random(7).shuffle(lines)
    _ok(_postflight(cli, path, write("shuffled.log", "\n".join(lines) + "\n")))


def test_the_same_lines_given_twice_count_once(cli, files, report):
    path, write = files
    text = ServerLog(report).text()
    doc = _ok(_postflight(cli, path, write("all.log", text), write("node0.log", text)))
    assert all(r["starts"] == 1 for r in doc["ranks"])


def test_binary_noise_a_cut_line_and_a_truncated_last_line(cli, files, report):
    """Noise between lines, a line a terminal cut (another rank's line later says it whole), and a log
    that ends mid-line: the values read are the whole ones, and a value only a cut line holds is named."""
    path, write = files
    log = ServerLog(report)
    noise = bytes(random.Random(3).randrange(256) for _ in range(4096))
    whole = log.text().encode()
    data = noise + b"\n" + whole + noise + b"\n"
    _ok(_postflight(cli, path, write("noisy.log", data)))
    # rank 7's lines last: cut its last line (the Mamba line) before the number's end
    text = log.text()
    cut = text[: text.rindex("max_mamba_cache_size: ") + len("max_mamba_cache_size: 3")]
    r = _postflight(cli, path, write("cut.log", cut))
    assert r.rc == 2, r.out[-1500:]
    doc = json.loads(r.out)
    (missing,) = [c for c in doc["checks"] if c["status"] == "missing"]
    assert missing["rank"] == 7 and missing["value"] == "max_mamba_cache_size"
    assert any("cut before max_mamba_cache_size" in e and "rank 7" in e for e in doc["errors"]), doc["errors"]


def test_gzip_and_standard_input(cli, files, report, monkeypatch):
    path, write = files
    text = ServerLog(report).text()
    _ok(_postflight(cli, path, write("server.log.gz", gzip.compress(text.encode()))))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    doc = _ok(_postflight(cli, path, "-"))
    assert doc["inputs"]["logs"] == ["<stdin>"]


def test_chunk_boundaries_and_an_endless_line_keep_memory_bounded(files, report, monkeypatch):
    """Chunks far smaller than a line, and a run of megabytes with no line break before the lines:
    every rank still read, the run skipped and counted."""
    monkeypatch.setattr(R, "CHUNK_BYTES", 7)
    text = ServerLog(report).text()
    reading = R.LogReading()
    R.read_log(reading, "x.log", io.BytesIO(text.encode()))
    assert len(ranks_read(reading)) == N
    monkeypatch.setattr(R, "CHUNK_BYTES", 1 << 20)
    reading = R.LogReading()
    stats = R.read_log(reading, "x.log", io.BytesIO(b"#" * (5 << 20) + b"\n" + text.encode()))
    assert len(ranks_read(reading)) == N and stats.skipped_runs >= 1
    assert stats.lines == text.count("\n") + 1


def test_lines_that_are_not_the_weights_line_are_not_read_as_it(cli, files, report):
    """``Memory baseline taken. mem usage=`` and ``Capture cuda graph end. ... mem usage=`` carry a mem
    usage too; only ``Load weight end.`` is the weights' figure."""
    path, write = files
    log = ServerLog(report)
    decoys = "\n".join(
        f"[2026-01-01 00:00:00 PP{p} TP{t}] {m}"
        for p in range(4)
        for t in range(2)
        for m in (
            "Memory baseline taken. mem usage=99.00 GB, avail mem=40.00 GB.",
            "Capture cuda graph end. Time elapsed: 3.00 s. mem usage=77.00 GB. avail mem=20.00 GB.",
        )
    )
    doc = _ok(_postflight(cli, path, write("server.log", decoys + "\n" + log.text())))
    assert {c["logged"] for c in doc["checks"] if c["value"] == "weights_gib"} == {18.62}


def test_a_restart_in_the_same_log_holds_the_latest_start(cli, files, report):
    """A first start with another pool size, then the start that serves: the latest is held, and the
    earlier one is said."""
    path, write = files
    first = ServerLog(report, override={r: {"max_mamba_cache_size": 30} for r in range(N)})
    early = "\n".join(line for rank in report["ranks"] for line in first.lines(rank, created=1_767_225_000.0))
    doc = _ok(_postflight(cli, path, write("server.log", ServerLog(report).text() + early + "\n")))
    assert doc["checks"] and all(c["logged"] != 30 for c in doc["checks"])
    assert all(r["starts"] == 2 for r in doc["ranks"])
    assert any("different starts; the latest (by timestamp) is held" in w for w in doc["warnings"])


def test_a_draft_models_weights_line_is_kept_apart(cli, files, report):
    path, write = files
    log = ServerLog(report)
    draft = ServerLog(
        report, override={r: {"type": "KimiLinearForCausalLMMTP", "weights_gib": 1.25} for r in range(N)}
    )
    later = "\n".join(
        line for rank in report["ranks"] for line in draft.lines(rank, created=1_767_226_000.0)[1:2]
    )
    doc = _ok(_postflight(cli, path, write("server.log", log.text() + later + "\n")))
    assert all(
        r["draft_weights"]
        == [{"type": "KimiLinearForCausalLMMTP", "gib": 1.25, "where": r["draft_weights"][0]["where"]}]
        for r in doc["ranks"]
    )
    assert all(r["weights_type"] == "KimiLinearForCausalLM" for r in doc["ranks"])


def test_a_custom_logging_format_is_one_line_naming_the_line_looked_for(cli, files, report):
    """SGLANG_LOGGING_CONFIG_PATH replaces SGLang's format: the ranks cannot be told apart, so it is
    refused in one line that names the line the checker looks for."""
    path, write = files
    custom = "".join(
        f"2026-01-01 00:00:00,000 INFO sglang.srt.model_executor.model_runner: {line.split('] ', 1)[1]}\n"
        for line in ServerLog(report).text().splitlines()
    )
    r = cli(["postflight", "--report", path, write("custom.log", custom)])
    assert r.rc == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert "none in SGLang's own format" in line and "SGLANG_LOGGING_CONFIG_PATH" in line
    assert "[%(asctime)s{prefix}]" in line and "Load weight end." in line


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "no line of an SGLang server's start"),
        (b"\x00\x01\x02" * 1000, "no line of an SGLang server's start"),
        (b"[2026-01-01 00:00:00] Uvicorn running on http://0.0.0.0:30000\n", "looked for"),
    ],
    ids=["empty", "binary", "not-a-start"],
)
def test_a_log_without_a_start_is_one_line(cli, files, data, says):
    path, write = files
    r = cli(["postflight", "--report", path, write("x.log", data)])
    assert r.rc == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert says in line and "x.log" in line


def test_a_missing_log_is_one_line(cli, files, tmp_path):
    path, _ = files
    r = cli(["postflight", "--report", path, str(tmp_path / "nope.log")])
    assert r.rc == 2
    (line,) = r.err.strip().splitlines()
    assert "cannot read log" in line and "nope.log" in line


# -- a speculative draft's own weights line, and a release older than any modelled -------------------------


def test_a_nextn_draft_line_is_never_read_as_the_targets_weights(cli, tmp_path):
    """A NEXTN deployment (Qwen3-Next, tp 4) logs, per rank, the target's ``Load weight end.`` and then the
    draft worker's, whose ``type=`` is the class SGLang's ModelConfig gives the draft
    (``Qwen3NextForCausalLMMTP``: 0.5.23 configs/model_config.py, ``is_draft_model``). A log that lost the
    start of an earlier start (rotated, ``kubectl logs --since``) holds that start's draft lines but, for
    TP1 and TP3, not their target lines: the first type those ranks logged was the draft's, and the
    reader took the draft's weights as the target's there. A registered draft class is never the target."""
    report = preflight_report(4, sizing={"tp_size": 4})
    path = tmp_path / "preflight.json"
    path.write_text(json.dumps(report))
    t0 = 1_767_225_600.0
    target = ServerLog(report, override={r: {"type": "Qwen3NextForCausalLM"} for r in range(4)})
    drafts = {r: {"type": "Qwen3NextForCausalLMMTP", "weights_gib": 1.5} for r in range(4)}
    draft = ServerLog(report, override=drafts)
    # The earlier start found the GPUs a little less free: its lines differ from the later start's.
    draft_before = ServerLog(report, override=drafts, free_gib=119.0)
    ranks = report["ranks"]
    earlier = [target.lines(r, created=t0)[1] for r in ranks if r["rank"] in (0, 2)]
    earlier += [draft_before.lines(r, created=t0 + 30)[1] for r in ranks]
    later = [line for r in ranks for line in target.lines(r, created=t0 + 600)]
    later += [draft.lines(r, created=t0 + 630)[1] for r in ranks]
    log = tmp_path / "server.log"
    log.write_text("\n".join(earlier + later) + "\n")
    reads = ranks_read(R.read_logs([str(log)]))
    assert [r.prefix for r in reads] == ["TP0", "TP1", "TP2", "TP3"]
    for r in reads:
        assert r.weights_type == "Qwen3NextForCausalLM", (r.prefix, r.weights_type)
        assert r.weights_gib.value == 18.62, (r.prefix, r.weights_gib)
        assert [(t, w.value) for t, w in r.draft_weights] == [("Qwen3NextForCausalLMMTP", 1.5)], r.prefix
    only = tmp_path / "draft-only.log"
    only.write_text("\n".join(draft.lines(r, created=t0)[1] for r in ranks) + "\n")
    for r in ranks_read(R.read_logs([str(only)])):  # the draft's line alone: no target weights logged
        assert r.weights_gib.value is None and r.weights_type is None, (r.prefix, r.weights_gib)
        assert "draft" in r.weights_gib.note, r.weights_gib
    res = cli(["postflight", "--report", str(path), str(log), "--format", "json"])
    assert res.rc == 0 and all(
        r["weights_type"] == "Qwen3NextForCausalLM" for r in json.loads(res.out)["ranks"]
    )


# SGLang 0.4.0's lines, as its own format strings write them (sglang-0.4.0 wheel, Dec 2024:
# model_executor/model_runner.py:260 and managers/scheduler.py:223), with its prefix "[%(asctime)s TP0] ".
OLD_LOG = (
    "[2024-12-05 10:00:00 TP0] Load weight begin. avail mem=78.50 GB\n"
    "[2024-12-05 10:00:31 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=63.20 GB\n"
    "[2024-12-05 10:00:33 TP0] max_total_num_tokens=1032191, max_prefill_tokens=16384, "
    "max_running_requests=4097, context_len=32768\n"
    "[2024-12-05 10:00:31 TP1] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=63.21 GB\n"
)


@pytest.mark.parametrize("command", ["postflight", "check"])
def test_a_log_of_a_release_older_than_any_modelled_is_one_line(cli, tmp_path, command):
    """SGLang 0.4's log (``Load weight end. type=..., avail mem=...``, no mem usage; a summary line without
    chunked_prefill_size) was read as "0.5.2-0.5.23" with its values missing. It is one line now, exit 2:
    the release is older than any modelled, with the form it was recognised by."""
    log = tmp_path / "server.log"
    log.write_text(OLD_LOG)
    if command == "postflight":
        res = cli(["postflight", str(log)])
        (line,) = res.err.strip().splitlines()
    else:
        argv = [
            "check",
            "--model",
            "kimi-k3",
            "--tp-size",
            "2",
            "--allow-single-rank",
            "--budget-from-device",
        ]
        res = cli([*argv, "--mem-fraction-static", "0.85", "--weights-from-log", str(log)])
        (line,) = res.err.strip().splitlines()
    assert res.rc == 2, res
    assert "older than any modelled release" in line and "0.5.2" in line, line
    assert "model_executor/model_runner.py:260" in line, line
