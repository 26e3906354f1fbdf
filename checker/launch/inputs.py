"""What a run reads: the files its outputs may never replace.

The launch command's flags that name what the server reads (the model, its tokenizer, a ``--config``
file, the draft model; a hub id's snapshot in the hub cache and under ``--download-dir``), and the
checker's own options that name a file it reads (:data:`READ_OPTIONS`). Read from the words as given,
so a command line that failed to parse is checked too (a refused rank's outputs pass the same check).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from checker.core.errors import CheckerInputError

LAUNCH_INPUT_FLAGS = (
    "--model-path",
    "--model",
    "--tokenizer-path",
    "--config",
    "--speculative-draft-model-path",
)
"""The launch command's flags that name what the server reads (``--model`` is ``--model-path``'s alias in
every release); an output must be none of them, and lie in none of their directories."""


def _word_value(words: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` (``flag V`` or ``flag=V``) in ``words``, as argparse keeps the last."""
    value = None
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def _local(path: str, revision: str | None = None) -> str:
    """A hub id as the local snapshot the run reads (the model's own rule); itself where it is none."""
    # start-up: the hub cache rules load only for a hub id or a model directory
    from checker.core.weights.hub_cache import local_model_path

    try:
        return local_model_path(path, revision=revision)
    except CheckerInputError:
        return path  # not cached: the model's own read says so; nothing here to protect


READ_OPTIONS: dict[str, str] = {
    "model_config": "--model-config",
    "weights_from_log": "--weights-from-log",
    "init_method": "--init-method",
}
"""The checker's own options whose values name files the run reads (dest -> flag), in every command that
takes them: no output may replace one (:func:`run_inputs`). postflight's are its own (its --report and
logs). tests/test_output_paths.py walks every parser: an option that names a file and is in neither
this list nor the outputs fails it."""


def _hub_snapshot(value: str, *, revision: str | None, download_dir: str | None) -> str | None:
    """The snapshot under ``--download-dir`` SGLang reads a hub id's weights from
    (``snapshot_download(cache_dir=download_dir)``), where it is there; None otherwise."""
    if not download_dir or os.path.exists(value):
        return None
    # start-up: the hub cache rules load only for a hub id under --download-dir
    from checker.core.weights.hub_cache import is_hub_id, local_model_path

    if not is_hub_id(value):
        return None
    try:
        return local_model_path(value, revision=revision, cache_dir=download_dir)
    except CheckerInputError:
        return None  # not downloaded there yet: SGLang fetches it at start-up; nothing to protect


def run_inputs(*, launch: Sequence[str] | None, **given: object) -> list[tuple[str, str]]:
    """What a run reads, each with how it was named: the launch command's model (and tokenizer, draft
    model, ``--config`` file; a hub id's snapshot in the hub cache, and under ``--download-dir`` where
    the weights are read from), and the checker's own options of :data:`READ_OPTIONS` (``given``: dest
    -> the value as given, one path or a list; ``--model-config``'s model directory too). Read from the
    words as given, so a command line that failed to parse is checked too."""
    unknown = set(given) - set(READ_OPTIONS)
    if unknown:
        raise TypeError(f"run_inputs: not options that name a file the run reads: {sorted(unknown)}")
    out: list[tuple[str, str]] = []
    words = list(launch or ())
    revision = _word_value(words, "--revision")
    download_dir = _word_value(words, "--download-dir")
    named = [(flag, _word_value(words, flag)) for flag in LAUNCH_INPUT_FLAGS]
    if len(words) > 2 and words[1] == "serve" and not words[2].startswith("-"):
        named.append(("--model-path", words[2]))  # `sglang serve MODEL` (0.5.16+)
    for flag, value in named:
        if value:
            model = flag in ("--model-path", "--model")
            local = _local(value, revision if model else None)
            out.append((f"the launch command's {flag}", local))
            if model and os.path.basename(local) == "config.json" and os.path.isfile(local):
                out.append(
                    (f"the model directory of the launch command's {flag}", os.path.dirname(local) or ".")
                )
            snapshot = _hub_snapshot(value, revision=revision, download_dir=download_dir) if model else None
            if snapshot is not None:
                out.append((f"the launch command's {flag} under --download-dir {download_dir}", snapshot))
    for dest, flag in READ_OPTIONS.items():
        raw = given.get(dest)
        values = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else []
        for value in values:
            if not isinstance(value, str) or not value or value == "-":
                continue
            if dest == "init_method":
                if value.startswith("file://"):
                    out.append((flag, value.removeprefix("file://")))
                continue
            if dest != "model_config":
                out.append((flag, value))
                continue
            local = _local(value)
            out.append((flag, local))
            if os.path.basename(local) == "config.json" and os.path.isfile(local):
                # A model's config.json: its directory is the model SGLang loads (weights, tokenizer).
                out.append((f"the model directory of {flag}", os.path.dirname(local) or "."))
    return out
