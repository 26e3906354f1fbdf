"""The page size an explicitly given attention backend makes each release use (issue 36 bad input), held to
the release's own code: the rules' table (checker/core/releases/page_rules.py) to SGLang's own page-size pass
where a CPU environment runs it, and the derivation and CLI to what those rules give."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases.page_rules import RULES
from checker.core.sizing.page_size import FLAG_OF, resolve_page_size

REPO = Path(__file__).resolve().parent.parent
CPU_HOME = Path(os.environ.get("SGLANG_CPU_HOME", Path.home() / ".cache" / "pp-checker" / "sglang-cpu"))
KIMI = REPO / "tests" / "fixtures" / "kimi_linear_48b_a3b.json"


def _page(release: str, page: int, **backends: str) -> int:
    return resolve_page_size(release, page, backends).page_size


def test_0_5_23_mla_and_trtllm_backends_change_the_page_size_as_its_overrides_do() -> None:
    # arg_groups/overrides.py:1143-1200 of 0.5.23
    assert _page("0.5.23", 16, attention_backend="flashmla") == 64
    assert _page("0.5.23", 128, decode_attention_backend="flashmla") == 64
    assert _page("0.5.23", 16, attention_backend="trtllm_mla") == 64
    assert _page("0.5.23", 32, attention_backend="trtllm_mla") == 32
    assert _page("0.5.23", 1, prefill_attention_backend="cutedsl_mla") == 64
    assert _page("0.5.23", 128, attention_backend="trtllm_mha") == 128
    assert _page("0.5.23", 8, speculative_draft_attention_backend="trtllm_mha") == 64
    assert _page("0.5.23", 16, attention_backend="hpc_ops") == 64
    assert _page("0.5.23", 16, attention_backend="triton") == 16
    # prefill trtllm_mla is not read by its rule (attention / decode only)
    assert _page("0.5.23", 16, prefill_attention_backend="trtllm_mla") == 16


def test_releases_differ_where_their_code_does() -> None:
    # cutlass_mla forces 128 up to 0.5.19, then leaves the parser's choices
    assert _page("0.5.19", 16, attention_backend="cutlass_mla") == 128
    with pytest.raises(FlagError, match=r"invalid choice: 'cutlass_mla'.*arg_groups/choices.py:\d+"):
        _page("0.5.23", 16, attention_backend="cutlass_mla")
    # trtllm_mha keeps 128 from 0.5.17 (16/32/64 before); the draft flag is read from 0.5.17
    assert _page("0.5.16", 128, attention_backend="trtllm_mha") == 64
    assert _page("0.5.17", 128, attention_backend="trtllm_mha") == 128
    assert _page("0.5.16", 8, speculative_draft_attention_backend="trtllm_mha") == 8
    # 0.5.23 renames tokenspeed_mla to cutedsl_mla first (serving_hook.py handle_deprecated_args)
    assert _page("0.5.23", 16, attention_backend="tokenspeed_mla") == 64
    # 0.5.2 alone forces ascend to 128
    assert _page("0.5.2", 16, attention_backend="ascend") == 128
    assert _page("0.5.3", 16, attention_backend="ascend") == 16


def test_the_phrase_names_the_backend_and_the_site() -> None:
    r = resolve_page_size("0.5.23", 16, {"attention_backend": "flashmla"})
    assert (r.page_size, r.changed_by, r.site) == (
        64,
        "--attention-backend flashmla",
        "arg_groups/overrides.py:1154",
    )
    assert "was 16" in r.phrase and "flashmla" in r.phrase
    assert resolve_page_size("0.5.23", 64, {"attention_backend": "flashmla"}).phrase == ""


def _cpu_envs() -> list[str]:
    python = CPU_HOME / "venv" / "bin" / "python"
    if not python.exists():
        return []
    return [
        v
        for v in ("0.5.15", "0.5.16", "0.5.17", "0.5.20", "0.5.22", "0.5.23")
        if (CPU_HOME / "releases" / v).is_dir()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("release", _cpu_envs() or ["none"])
def test_the_table_resolves_as_the_release_s_own_page_pass(release: str) -> None:
    """Every backend a rule names (and one none does), each backend flag, page 1-128: the page size the
    table gives equals what the release's own ``_mla_backend_page_constraints`` returns."""
    if release == "none":
        pytest.skip(f"no SGLang CPU environment under {CPU_HOME}")
    backends = sorted({r[0] for r in RULES[release]} | {"triton"})
    env = dict(
        os.environ, PYTHONPATH=f"{REPO / 'scripts' / 'sglang_stubs'}:{CPU_HOME / 'releases' / release}"
    )
    out = subprocess.run(
        [
            str(CPU_HOME / "venv" / "bin" / "python"),
            str(REPO / "tests" / "page_probe.py"),
            ",".join(backends),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    ).stdout
    grid = json.loads(out.strip().splitlines()[-1])
    assert len(grid) == len(backends) * len(FLAG_OF) * 5
    for flag, backend, page, resolved in grid:
        assert _page(release, page, **{flag: backend}) == resolved, (flag, backend, page)


def _derive(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "kimi"
    model.mkdir(exist_ok=True)
    shutil.copy(KIMI, model / "config.json")
    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(model), "--pp-size", "2"]
    launch += ["--tp-size", "4", "--page-size", "16", *extra]
    cmd = [
        sys.executable,
        "-m",
        "checker",
        "derive",
        "--budget-gib",
        "30",
        "--sglang-version",
        "0.5.23",
        "--",
    ]
    cmd += launch
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_derive_aligns_the_pool_to_the_page_the_backend_forces_and_says_so(tmp_path: Path) -> None:
    r = _derive(tmp_path, "--attention-backend", "flashmla")
    assert r.returncode == 0, r.stderr
    assert "page size 64 (was 16: --attention-backend flashmla forces it)" in r.stdout
    tokens = int(r.stdout.split("max_total_num_tokens ")[-1].split()[0].replace(",", ""))
    assert tokens % 64 == 0 and tokens == 3679744  # 3,679,760 at page 16 (issue 36's example), down to 64


def test_a_backend_the_release_does_not_take_is_its_argparse_refusal(tmp_path: Path) -> None:
    r = _derive(tmp_path, "--attention-backend", "cutlass_mla")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "invalid choice: 'cutlass_mla'" in lines[0] and "SGLang 0.5.23" in lines[0]


def test_check_says_the_backend_changed_the_page_in_every_output() -> None:
    """check's text, step summary and JUnit say what derive says, and each rank's JSON entry carries the
    page size its pool aligned to, as an integer (inputs.page_size stays as given)."""
    import dataclasses

    from test_report import World, decided

    from checker.distributed.wire import digest
    from checker.outputs.report import kv_pool_line, to_json, to_junit, to_markdown, to_text

    v = decided(World(2, (("page_size", 16), ("attention_backend", "flashmla"))))
    said = "page size 64 (was 16: --attention-backend flashmla forces it)"
    assert said in to_text(v, summary="s", elapsed_s=1.0)
    assert said in to_markdown(v, summary="s")
    assert said in to_junit(v, elapsed_s=1.0).split("<system-out>")[-1]
    doc = json.loads(json.dumps(to_json(v, extra={})))
    assert [r["page_size"] for r in doc["ranks"]] == [64, 64]
    assert all(r["inputs"]["page_size"] == 16 for r in doc["ranks"])
    assert all(r["max_total_num_tokens"] % 64 == 0 for r in doc["ranks"])
    # a rank whose page stands (no backend) is its own group, named
    plain = dataclasses.replace(
        v.rows[1], page_size=16, inputs={**v.rows[1].inputs, "attention_backend": None}
    )
    plain.input_digests = {**v.rows[1].input_digests, "attention_backend": digest(None)}
    line = kv_pool_line([v.rows[0], plain]) or ""
    assert f"rank 0: {said}; rank 1: page size 16" in line, line
    # page 1 as given and unchanged: nothing said
    assert "page size" not in (kv_pool_line(decided(World(2)).rows) or "")
