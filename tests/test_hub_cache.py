"""A hub id is found in the local Hugging Face cache, as SGLang finds it offline
(checker/core/weights/hub_cache.py).

Every cache here is made by the test in tmp_path with huggingface_hub's documented layout
(``models--ORG--NAME/refs/<rev>`` holding a commit, ``snapshots/<commit>/config.json`` a link into
``blobs/``); nothing reaches a network. The same cases run once more through the real huggingface_hub
(``try_to_load_from_cache``) where the SGLang CPU environment has it, so the two readings cannot drift.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from checker.core.errors import ConfigError, FlagError
from checker.core.weights import hub_cache
from checker.core.weights.hub_cache import hub_cache as cache_of
from checker.core.weights.hub_cache import local_model_path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
QWEN = "Qwen/Qwen3-Next-80B-A3B-Instruct"
MAIN = "1" * 40
DEV = "2" * 40
TAGGED = "3" * 40
LOOSE = "4" * 40
"""A commit with a snapshot and no ref: reachable only by its full hash."""
HF_VARS = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "XDG_CACHE_HOME",
    "TRANSFORMERS_CACHE",
    "PYTORCH_TRANSFORMERS_CACHE",
    "PYTORCH_PRETRAINED_BERT_CACHE",
    "SGLANG_USE_MODELSCOPE",
)
HF_PYTHON = Path.home() / ".cache/pp-checker/sglang-cpu/venv/bin/python"
WHEELS = Path.home() / ".cache/pp-checker/wheels"


def make_cache(hub: Path, repo: str = QWEN, config: Path = FIXTURES / "qwen3_next_80b_a3b.json") -> Path:
    """A hub cache as `hf download` leaves it: refs main, dev and v1.0 (dev and v1.0 with 44 layers, so
    the revision read shows in what is derived), and a commit without a ref."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    data = json.loads(config.read_text())
    for commit, layers in ((MAIN, None), (DEV, 44), (TAGGED, 44), (LOOSE, 40)):
        body = dict(data) if layers is None else {**data, "num_hidden_layers": layers}
        blob = folder / "blobs" / f"blob{commit[0]}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_text(json.dumps(body))
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(MAIN)
    (folder / "refs" / "dev").write_text(DEV)
    (folder / "refs" / "v1.0").write_text(TAGGED)
    return folder


@pytest.fixture
def clean_env(monkeypatch):
    for name in HF_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")  # the default cache must not be the machine's
    return monkeypatch


@pytest.fixture
def hub(tmp_path, clean_env) -> Path:
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    make_cache(tmp_path / "hf" / "hub")
    return tmp_path / "hf" / "hub"


def _snapshot(hub: Path, commit: str) -> str:
    return str(hub / ("models--" + QWEN.replace("/", "--")) / "snapshots" / commit)


@pytest.mark.parametrize(
    ("revision", "commit"),
    [(None, MAIN), ("main", MAIN), ("dev", DEV), ("v1.0", TAGGED), (LOOSE, LOOSE), (DEV, DEV)],
    ids=["default", "main", "branch", "tag", "commit-without-ref", "commit-with-ref"],
)
def test_a_hub_id_resolves_to_its_cached_snapshot(hub, revision, commit):
    got = local_model_path(QWEN, revision=revision)
    assert got == _snapshot(hub, commit)
    assert json.loads(Path(got, "config.json").read_text())["model_type"] == "qwen3_next"


def test_the_cache_directory_follows_huggingface_hubs_variables(tmp_path, clean_env):
    """HF_HUB_CACHE over the legacy HUGGINGFACE_HUB_CACHE over HF_HOME/hub over XDG_CACHE_HOME."""
    for name in ("a", "b", "c"):
        make_cache(tmp_path / name / "hub")
    make_cache(tmp_path / "d" / "huggingface" / "hub")
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "d"))
    assert local_model_path(QWEN) == _snapshot(tmp_path / "d" / "huggingface" / "hub", MAIN)
    clean_env.setenv("HF_HOME", str(tmp_path / "c"))
    assert local_model_path(QWEN) == _snapshot(tmp_path / "c" / "hub", MAIN)
    clean_env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "b" / "hub"))
    assert local_model_path(QWEN) == _snapshot(tmp_path / "b" / "hub", MAIN)
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "a" / "hub"))
    assert local_model_path(QWEN) == _snapshot(tmp_path / "a" / "hub", MAIN)
    assert cache_of().source == "HF_HUB_CACHE"


def test_another_cache_directory_may_be_named(tmp_path, hub):
    """The weights loader's --download-dir is a cache of the same layout."""
    make_cache(tmp_path / "weights")
    assert local_model_path(QWEN, cache_dir=str(tmp_path / "weights")) == _snapshot(
        tmp_path / "weights", MAIN
    )
    with pytest.raises(ConfigError, match=r"cache .*/nowhere \(from --download-dir\)"):
        local_model_path(QWEN, cache_dir=str(tmp_path / "nowhere"))


def test_an_id_not_in_the_cache_is_one_line_naming_where_and_how_to_fetch(hub):
    with pytest.raises(ConfigError) as exc:
        local_model_path("Qwen/Qwen3.5-27B")
    line = str(exc.value)
    assert "\n" not in line
    assert line.startswith("--model-path Qwen/Qwen3.5-27B: no such local path, and not in the Hugging Face")
    assert f" cache {hub} (from HF_HOME)" in line
    assert "(from HF_HOME) at revision main" in line
    assert "`hf download Qwen/Qwen3.5-27B`" in line and "huggingface-cli download Qwen/Qwen3.5-27B" in line


@pytest.mark.parametrize(
    ("revision", "says"),
    [
        ("v9", "no ref or snapshot v9 in models--Qwen--Qwen3-Next-80B-A3B-Instruct (refs there: dev, main, "),
        (LOOSE[:12], "a commit is named by all 40 characters"),
        ("../../etc", "not a branch, tag or commit name"),
    ],
)
def test_a_revision_the_cache_lacks_is_one_line(hub, revision, says):
    with pytest.raises(ConfigError) as exc:
        local_model_path(QWEN, revision=revision)
    assert says in str(exc.value) and "\n" not in str(exc.value)
    if "not a branch" not in says:
        assert f"`hf download {QWEN} --revision {revision}`" in str(exc.value)


def test_a_snapshot_without_config_or_a_dangling_ref_is_named(hub):
    folder = hub / ("models--" + QWEN.replace("/", "--"))
    (folder / "snapshots" / DEV / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"snapshots/222222222222\.\.\. has no config.json"):
        local_model_path(QWEN, revision="dev")
    (folder / "refs" / "main").write_text("9" * 40)
    with pytest.raises(ConfigError, match=r"refs/main names commit 9{40}, not in snapshots/"):
        local_model_path(QWEN)


def test_a_local_path_wins_and_what_is_no_hub_id_is_left_to_the_caller(hub, tmp_path, monkeypatch):
    """SGLang's order: os.path.exists first. A directory named like a hub id is that directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-Next-80B-A3B-Instruct").mkdir(parents=True)
    assert local_model_path(QWEN) == QWEN
    assert local_model_path("/models/M") == "/models/M"  # no hub id: the caller's "no such path" line
    assert local_model_path("a/b/c") == "a/b/c"
    assert local_model_path("config.json") == "config.json"  # a missing file, said as one


def test_modelscope_is_refused_in_one_line(hub, clean_env):
    clean_env.setenv("SGLANG_USE_MODELSCOPE", "true")
    with pytest.raises(ConfigError, match=r"SGLANG_USE_MODELSCOPE is set.*modelscope download --model"):
        local_model_path(QWEN)


def test_transformers_4_releases_read_transformers_cache_first(tmp_path, clean_env):
    """transformers 4.x (0.5.2-0.5.9's pin) reads a config from TRANSFORMERS_CACHE; 5.x does not."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("transformers")
    except PackageNotFoundError:
        pass
    else:
        pytest.skip("transformers is installed: its own version decides")
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    clean_env.setenv("TRANSFORMERS_CACHE", str(tmp_path / "tf"))
    assert cache_of(release="0.5.9").source == "TRANSFORMERS_CACHE"
    assert cache_of(release="0.5.6.post1").source == "HF_HUB_CACHE"
    assert cache_of(release="0.5.10").source == "HF_HUB_CACHE"


@pytest.mark.skipif(not WHEELS.is_dir(), reason="the release wheels are not here")
def test_the_transformers_pins_match_the_wheels():
    for wheel in sorted(WHEELS.glob("sglang-*.whl")):
        release = wheel.name.split("-")[1]
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            pin = next(
                line.split("==")[1].split(";")[0].strip()
                for line in z.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist: transformers==")
            )
        assert hub_cache._transformers_4(release) == pin.startswith("4."), (release, pin)


# ---- through the commands ------------------------------------------------------------------------------


def test_derive_reads_a_hub_id_of_the_launch_command_from_the_cache(cli, hub):
    """The whole path: `derive -- --model-path ORG/NAME` derives what the model's config.json gives, and
    --revision picks the snapshot (dev has 44 layers)."""
    fixture = str(FIXTURES / "qwen3_next_80b_a3b.json")
    direct = cli(["derive", "--format", "json", "--pp-size", "1", "--model-config", fixture])
    via_hub = cli(["derive", "--format", "json", "--", "--model-path", QWEN, "--pp-size", "1"])
    launch = ["--", "--model-path", QWEN, "--pp-size", "1"]
    dev = cli(["derive", "--format", "json", *launch, "--revision", "dev"])
    assert direct.rc == via_hub.rc == dev.rc == 0, (via_hub.err, dev.err)
    docs = [json.loads(r.out) for r in (direct, via_hub, dev)]
    assert docs[0]["ranks"] == docs[1]["ranks"]
    assert [d["geometry"]["num_hidden_layers"] for d in docs] == [48, 48, 44]
    assert docs[1]["geometry"]["name"].startswith(_snapshot(hub, MAIN))


def test_the_checkers_own_model_config_takes_a_hub_id_by_the_same_rule(cli, hub):
    a = cli(["derive", "--format", "json", "--pp-size", "1", "--model-config", QWEN])
    launch = ["--", "--model-path", QWEN, "--pp-size", "1"]
    b = cli(["derive", "--format", "json", "--model-config", QWEN, *launch])
    assert a.rc == b.rc == 0, (a.err, b.err)
    assert json.loads(a.out)["ranks"] == json.loads(b.out)["ranks"]
    assert json.loads(a.out)["geometry"]["name"].startswith(_snapshot(hub, MAIN))


def test_derive_with_a_hub_id_not_cached_is_one_line(cli, hub):
    res = cli(["derive", "--", "--model-path", "nvidia/Nemotron-H-8B", "--revision", "v2"])
    (line,) = res.err.splitlines()
    assert res.rc == 2 and "Traceback" not in res.err
    assert f"not in the Hugging Face cache {hub} (from HF_HOME) at revision v2" in line
    assert "`hf download nvidia/Nemotron-H-8B --revision v2`" in line


def test_check_reads_a_hub_id_from_the_cache(run_checker, tmp_path, clean_env):
    make_cache(tmp_path / "hub")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "OMP_NUM_THREADS": "1", "HOME": "/nonexistent-home"}
    args = ["check", "--allow-single-rank", "--budget-gib", "8", "-q", "--", "--model-path", QWEN]
    proc = run_checker([*args, "--pp-size", "1"], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "consistent" in proc.stdout


# ---- the same cases through the real huggingface_hub ----------------------------------------------------

_PROBE = """
import json, sys
from checker.core.weights import hub_cache
import huggingface_hub  # the real one: the lookup must go through it
calls = []
real = huggingface_hub.try_to_load_from_cache
def spy(*a, **k):
    calls.append(1)
    return real(*a, **k)
huggingface_hub.try_to_load_from_cache = spy
out = {}
for rev in json.loads(sys.argv[1]):
    try:
        out[str(rev)] = hub_cache.local_model_path(sys.argv[2], revision=rev)
    except Exception as exc:
        out[str(rev)] = type(exc).__name__
print(json.dumps({"calls": len(calls), "out": out}))
"""


def _hf_hub_python() -> str:
    if not HF_PYTHON.exists():
        pytest.skip("no SGLang CPU environment (scripts/sglang_cpu_env.sh) with huggingface_hub")
    probe = subprocess.run([str(HF_PYTHON), "-c", "import huggingface_hub"], capture_output=True, timeout=60)
    if probe.returncode:
        pytest.skip("huggingface_hub does not import in the SGLang CPU environment")
    return str(HF_PYTHON)


def test_huggingface_hub_and_the_layout_read_one_answer(hub):
    python = _hf_hub_python()
    revisions = [None, "main", "dev", "v1.0", LOOSE, LOOSE[:12], "v9"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [python, "-c", _PROBE, json.dumps(revisions), QWEN]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["calls"] == len(revisions)  # every lookup went through it
    mine = {}
    for rev in revisions:
        try:
            mine[str(rev)] = local_model_path(QWEN, revision=rev)
        except (ConfigError, FlagError) as exc:
            mine[str(rev)] = type(exc).__name__
    assert got["out"] == mine
    assert mine["dev"] == _snapshot(hub, DEV)
