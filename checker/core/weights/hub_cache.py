"""A model named by its Hugging Face hub id, found in the local cache as SGLang finds it offline (torch-free).

SGLang hands ``--model-path`` and ``--revision`` unchanged to transformers (``AutoConfig.from_pretrained(
model_path, revision=...)``, ``sglang/srt/utils/hf_transformers/config.py`` ``get_config``; up to 0.5.9
``hf_transformers_utils.py``) and to huggingface_hub for the weights (``snapshot_download(model_path,
revision=..., cache_dir=--download-dir)``, ``model_loader/weight_utils.py``). A path that exists is a local
model; anything else is a hub id, which without a network (or with ``HF_HUB_OFFLINE``) is found only in the
cache: ``<cache>/models--ORG--NAME/refs/<revision>`` holds the commit a branch or tag points to, and
``snapshots/<commit>/`` the files of that commit (links into ``blobs/``). A revision that names no ref is
taken as a commit (``huggingface_hub.try_to_load_from_cache``; ``hf_hub_download`` offline does the same).

The cache directory, as huggingface_hub's ``constants`` read it at import (every release's pinned
huggingface_hub, through 2.4): ``HF_HUB_CACHE``, else the legacy ``HUGGINGFACE_HUB_CACHE``, else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``. The config
itself is read by transformers, and transformers 4.x (the releases before 0.5.10 but 0.5.6.post1, by their
wheels' pins) looks first in its own legacy ``TRANSFORMERS_CACHE`` (then ``PYTORCH_TRANSFORMERS_CACHE``,
``PYTORCH_PRETRAINED_BERT_CACHE``; ``transformers/utils/hub.py``); transformers 5 dropped them.

:func:`local_model_path` is the one rule: the launch command's ``--model-path`` (with its ``--revision``) and
the checker's own ``--model-config`` both go through it, and what it returns is a local path (the snapshot
directory for a hub id: its config.json now, its safetensors for whoever reads the weights). Where
huggingface_hub is installed (SGLang depends on it) its ``try_to_load_from_cache`` finds the snapshot; the
documented layout is read the same way otherwise. Never the network.

``SGLANG_USE_MODELSCOPE`` makes SGLang fetch a non-local path from ModelScope instead (its ``AutoConfig`` and
``snapshot_download``, ``hf_transformers/common.py``), whose cache is another layout: refused with one line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from checker.core.errors import CheckerInputError, ConfigError, printable
from checker.core.releases.releases import release_key

CONFIG_NAME = "config.json"
REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b")
"""huggingface_hub's ``REPO_ID_REGEX`` (``utils/_validators.py``); with :func:`is_hub_id`'s other rules,
``validate_repo_id``: what transformers accepts as a hub id instead of a path."""
COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"
_TRUE = ("true", "1", "yes", "y")
"""How ``SGLANG_USE_MODELSCOPE`` reads as set (``sglang/srt/environ.py`` EnvBool; ``get_bool_env_var``
takes the first two)."""
TRANSFORMERS_4_UNTIL = (0, 5, 10)
"""The first release whose wheel pins transformers 5 (``Requires-Dist: transformers==5.3.0``); every
earlier one pins 4.56-4.57 but :data:`TRANSFORMERS_5_BEFORE`. tests/test_hub_cache.py reads the wheels."""
TRANSFORMERS_5_BEFORE = frozenset({"0.5.6.post1"})
"""Earlier releases that pin transformers 5 (0.5.6.post1: ``transformers==5.0.0rc0``)."""
_TRANSFORMERS_LEGACY = ("TRANSFORMERS_CACHE", "PYTORCH_TRANSFORMERS_CACHE", "PYTORCH_PRETRAINED_BERT_CACHE")


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


@dataclass(frozen=True)
class HubCache:
    """Where the cache is and which variable said so (for the line that says where it looked)."""

    path: str
    source: str


def hub_cache(
    env: os._Environ[str] | dict[str, str] | None = None, *, release: str | None = None
) -> HubCache:
    """The directory SGLang's transformers reads a hub model's config from (see the module docstring)."""
    env = os.environ if env is None else env
    if _transformers_4(release):
        for name in _TRANSFORMERS_LEGACY:
            if env.get(name):
                return HubCache(_expand(env[name]), name)
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name) is not None:
            return HubCache(_expand(env[name]), name)
    if env.get("HF_HOME") is not None:
        return HubCache(os.path.join(_expand(env["HF_HOME"]), "hub"), "HF_HOME")
    if env.get("XDG_CACHE_HOME") is not None:
        return HubCache(os.path.join(_expand(env["XDG_CACHE_HOME"]), "huggingface", "hub"), "XDG_CACHE_HOME")
    return HubCache(os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub"), "the default")


def _transformers_4(release: str | None) -> bool:
    """Whether the transformers that will read the config is 4.x: the installed one where there is one
    (what the server on this node imports), else the one ``release`` pins."""
    # start-up: importlib.metadata is off the CLI's import path (docs/performance.md)
    from importlib import metadata

    try:
        return metadata.version("transformers").split(".")[0] == "4"
    except (metadata.PackageNotFoundError, ValueError):
        pass
    if release is None:
        return False

    try:
        key = release_key(release)
    except CheckerInputError:
        return False
    return key[:3] < TRANSFORMERS_4_UNTIL and release not in TRANSFORMERS_5_BEFORE


def is_hub_id(name: str) -> bool:
    """huggingface_hub's ``validate_repo_id``: ``NAME`` or ``ORG/NAME``, word characters, ``-``, ``.``.
    A bare ``NAME.json`` is taken for a missing file (``--model-config config.json``), not a repository:
    both are refused, and "no such file" is the line that helps."""
    if "/" not in name and name.endswith(".json"):
        return False
    return (
        name.count("/") <= 1
        and REPO_ID.fullmatch(name) is not None
        and "--" not in name
        and ".." not in name
        and not name.endswith(".git")
    )


def modelscope_requested(env: os._Environ[str] | dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("SGLANG_USE_MODELSCOPE", "").strip().lower() in _TRUE


def _exists(path: str) -> bool:
    """``os.path.exists`` as SGLang asks it (a path the system refuses outright is not there)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def local_model_path(
    name: str,
    *,
    revision: str | None = None,
    flag: str = "--model-path",
    release: str | None = None,
    cache_dir: str | None = None,
) -> str:
    """``name`` as a local path: itself where it exists (SGLang's ``os.path.exists``), else, for a hub id,
    the cached snapshot directory of ``revision`` (default main). Anything else is returned unchanged for
    the caller's own "no such file" line. Raises ConfigError (one line: where it looked and how to fetch
    it) for a hub id the cache does not hold. ``cache_dir``: another cache than the config's (the
    launch command's ``--download-dir``, where SGLang's weights loader looks: ``snapshot_download(...,
    cache_dir=download_dir)``)."""
    if not name or _exists(name) or not is_hub_id(name):
        return name
    shown = printable(name)
    if modelscope_requested():
        raise ConfigError(
            f"{flag} {shown}: no such local path, and SGLANG_USE_MODELSCOPE is set, so SGLang would fetch "
            "it from ModelScope, whose cache the checker does not read; download it first (modelscope "
            f"download --model {shown} --local_dir DIR) and give {flag} DIR"
        )
    rev = revision or DEFAULT_REVISION
    _check_revision(rev, flag)
    cache = (
        hub_cache(release=release) if cache_dir is None else HubCache(_expand(cache_dir), "--download-dir")
    )
    found = _from_huggingface_hub(name, rev, cache.path)
    if found is None:
        found = _from_layout(name, rev, cache.path)
    if isinstance(found, str):
        return os.path.dirname(found)
    raise ConfigError(_not_cached(name, rev, revision is not None, cache, found, flag))


def _check_revision(revision: str, flag: str) -> None:
    """A revision is a name under ``refs/`` or a commit: never a way out of the repository's folder."""
    parts = revision.split("/")
    if revision.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in revision:
        raise ConfigError(
            f"--revision {printable(revision)} (for {flag}): not a branch, tag or commit name; give e.g. "
            "main, v1.0 or a 40-character commit"
        )


class _Missing:
    """Why the layout has no config.json for the revision (for the line)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _repo_folder(name: str) -> str:
    return "--".join(["models", *name.split("/")])


def _from_huggingface_hub(name: str, revision: str, cache: str) -> str | _Missing | None:
    """huggingface_hub's own lookup where it is installed; None where it is not (or cannot answer)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # optional dependency: installed beside SGLang
    except Exception:  # not installed, or an install that does not import: the layout is read instead
        return None
    try:
        found = try_to_load_from_cache(name, CONFIG_NAME, cache_dir=cache, revision=revision)
    except Exception:
        return None
    if isinstance(found, str):
        return found
    return None  # not cached (or cached as missing): the layout walk says which, for the line


def _read_ref(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(256)  # as huggingface_hub reads it: no strip
    except (OSError, UnicodeDecodeError):
        return None


def _from_layout(name: str, revision: str, cache: str) -> str | _Missing:
    """The documented cache layout, read as ``try_to_load_from_cache`` reads it."""
    repo = os.path.join(cache, _repo_folder(name))
    if not os.path.isdir(repo):
        return _Missing(f"no {_repo_folder(name)} there")
    commit = revision
    ref = os.path.join(repo, "refs", revision)
    if os.path.isfile(ref):
        text = _read_ref(ref)
        if text is None:
            return _Missing(f"refs/{revision} cannot be read")
        commit = text
    snapshots = os.path.join(repo, "snapshots")
    try:
        cached = os.listdir(snapshots)
    except OSError:
        cached = []
    if commit not in cached:
        refs = _refs(repo)
        have = f"refs there: {', '.join(refs)}" if refs else "no refs there"
        if commit != revision:
            return _Missing(
                f"refs/{revision} names commit {printable(commit)[:48]}, not in snapshots/ ({have})"
            )
        short = (
            "; a commit is named by all 40 characters"
            if re.fullmatch(r"[0-9a-f]{7,39}", revision) and any(c.startswith(revision) for c in cached)
            else ""
        )
        return _Missing(f"no ref or snapshot {printable(revision)} in {_repo_folder(name)} ({have}){short}")
    config = os.path.join(snapshots, commit, CONFIG_NAME)
    if os.path.isfile(config):
        return config
    if os.path.isfile(os.path.join(repo, ".no_exist", commit, CONFIG_NAME)):
        return _Missing(f"the repository has no {CONFIG_NAME} at {commit[:12]} (recorded in .no_exist/)")
    return _Missing(f"snapshots/{commit[:12]}... has no {CONFIG_NAME} (an incomplete download)")


def _refs(repo: str, limit: int = 8) -> list[str]:
    out: list[str] = []
    base = os.path.join(repo, "refs")
    for root, _dirs, files in os.walk(base):
        for f in sorted(files):
            out.append(os.path.relpath(os.path.join(root, f), base))
            if len(out) >= limit:
                return out
    return out


def _not_cached(
    name: str, revision: str, given: bool, cache: HubCache, found: str | _Missing, flag: str
) -> str:
    shown = printable(name)
    why = found.why if isinstance(found, _Missing) else "not found"
    where = f"{printable(cache.path)} (from {cache.source})" if cache.source != "the default" else cache.path
    fetch_rev = f" --revision {printable(revision)}" if given else ""
    return (
        f"{flag} {shown}: no such local path, and not in the Hugging Face cache {where} at revision "
        f"{printable(revision)}: {why}; fetch it with `hf download {shown}{fetch_rev}` (older "
        f"huggingface_hub: `huggingface-cli download {shown}{fetch_rev}`), set HF_HUB_CACHE or HF_HOME to "
        "the cache that holds it, or give the model's directory"
    )
