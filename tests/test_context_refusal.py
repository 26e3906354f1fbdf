"""A --context-length above the config's without SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: each modelled
release's own refusal (configs/model_config.py ``raise ValueError``), quoted with its file:line, one line,
exit 2; with the variable set the longer context is taken, as the release takes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.core.releases.kv_support import KV_CODE
from checker.core.releases.releases import MODELLED_RELEASES

QWEN = str(Path(__file__).resolve().parent / "fixtures" / "qwen3_next_80b_a3b.json")
SRC = Path("/work/sglang-src")


@pytest.mark.parametrize(("release", "at"), [("0.5.2", 192), ("0.5.9", 382), ("0.5.23", 1314)])
def test_longer_context_is_the_releases_own_refusal(cli, monkeypatch, release, at):
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    argv = ["derive", "--sglang-version", release, "--pp-size", "1", "--"]
    res = cli([*argv, "--model-path", QWEN, "--context-length", "300000"])
    assert res.rc == 2 and res.out == ""
    (line,) = res.err.splitlines()
    assert (
        "User-specified context_length (300000) is greater than the derived context_length (262144)" in line
    )
    assert f"sglang/srt/configs/model_config.py:{at})" in line
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in line


def test_the_override_variable_lets_it_through(cli):
    env = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    res = cli(
        [
            "derive",
            "--pp-size",
            "1",
            "--format",
            "json",
            "--",
            "--model-path",
            QWEN,
            "--context-length",
            "300000",
        ],
        env=env,
    )
    assert res.rc == 0, res.err
    assert "300000" in res.out


@pytest.mark.skipif(not SRC.is_dir(), reason="no unpacked SGLang sources here")
def test_every_quoted_line_is_the_releases_raise():
    """The generated file:line (scripts/build_kv_pool.py) is the ``raise ValueError(`` of that release."""
    for v in MODELLED_RELEASES:
        path, line = KV_CODE[v].context_refusal_at.split(":")
        source = SRC / v / "sglang" / "srt" / path
        if not source.is_file():
            continue
        lines = source.read_text().splitlines()
        assert "raise ValueError(" in lines[int(line) - 1], v
        assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in "\n".join(
            lines[int(line) - 1 : int(line) + 2]
        ), v
