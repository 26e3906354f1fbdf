"""Where each rank's weights figure comes from, and the figure itself (torch-free).

The budget SGLang gives a rank (``--budget-from-device``, ``plan``'s fraction) is free memory after the
weights; the weights figure per rank is, by precedence:

* ``flag``: ``--weights-gib`` (one value for every rank, or one per rank), when given;
* ``log``: ``--weights-from-log`` (check, plan): the figures an earlier start's server logged;
* ``checkpoint``: the model directory's safetensors checkpoint beside its config.json, read from the
  shard headers (:mod:`checker.core.checkpoint`), checked against config.json
  (:mod:`checker.core.checkpoint_names`), and held as the release's class holds it
  (:mod:`checker.core.weights`): parameters exactly, plus the stated margin (buffers, kept copies,
  allocator segments);
* none: no flag and no checkpoint (a preset, a JSON model spec, a directory with only config.json).

:class:`WeightsSource` is the small enum the report carries; a later source (the server's own log line)
adds a member.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checker.core.errors import ConfigError, FlagError
from checker.core.models import read_json

if TYPE_CHECKING:
    from checker.core.checkpoint import Checkpoint
    from checker.core.weights import ModelWeights, RankWeights, WeightsLayout


class WeightsSource(enum.IntEnum):
    """Where a rank's weights figure came from. Integer values go on the wire (a rank row)."""

    NONE = 0
    FLAG = 1
    CHECKPOINT = 2
    LOG = 3

    @property
    def label(self) -> str:
        return {0: "none", 1: "flag", 2: "checkpoint", 3: "log"}[int(self)]


@dataclass(frozen=True)
class RankWeightsFigure:
    """One rank's weights figure and where it came from (``detail``: the checkpoint's parts, when read)."""

    gib: float | None
    source: WeightsSource
    detail: RankWeights | None = None


def _quantization(config: Mapping[str, Any], flag: str | None) -> str | None:
    q = config.get("quantization_config")
    if isinstance(q, Mapping):
        method = q.get("quant_method")
        return str(method) if method else "a quantization_config"
    text = config.get("text_config")
    if isinstance(text, Mapping) and isinstance(text.get("quantization_config"), Mapping):
        return str(text["quantization_config"].get("quant_method") or "a quantization_config")
    return flag or None


def checkpoint_weights(
    directory: str | Path,
    layout: WeightsLayout,
    *,
    release: str,
    quantization: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[ModelWeights, Checkpoint]:
    """Every rank's weights for ``layout`` from the checkpoint in ``directory`` (config.json beside it).

    Refused in one line: a quantized model (``quantization_config`` in config.json, or ``--quantization``):
    its held weights are not modelled; a family the checker does not model; a checkpoint whose tensors
    contradict config.json or whose shards are broken (:func:`read_checkpoint`)."""
    # start-up: the checkpoint reader and the weights rules (12-21 ms a rank, measured) load only when a
    # checkpoint is read; every rank imports this module for WeightsSource and weights_per_rank
    from checker.core.checkpoint import read_checkpoint
    from checker.core.checkpoint_names import check_shapes
    from checker.core.weights import family_of, model_weights

    d = Path(directory)
    if config is None:
        config = read_json(d / "config.json")
    method = _quantization(config, quantization)
    if method:
        raise FlagError(
            f"{d}: the model is quantized ({method}); the checker derives the weights of unquantized "
            "(bf16/fp16/fp32) checkpoints only: give the weights per GPU with --weights-gib (the largest "
            "'mem usage' of an earlier server start's 'Load weight end' lines)"
        )
    family_of(config, str(d / "config.json"))  # an unmodelled family is refused before any shard is read
    ckpt = read_checkpoint(d)
    check_shapes(ckpt, config, str(d / "config.json"))
    return model_weights(config, layout, release=release, source=str(d / "config.json")), ckpt


def weights_per_rank(
    *,
    flag_gib: Sequence[float],
    flag_source: WeightsSource = WeightsSource.FLAG,
    world_size: int,
    model_dir: str | Path | None,
    layout: WeightsLayout | None,
    release: str,
    quantization: str | None = None,
) -> list[RankWeightsFigure]:
    """Every rank's weights figure, by precedence: ``--weights-gib`` (or the figures of
    ``--weights-from-log``: ``flag_source`` LOG), else the checkpoint in ``model_dir`` (when it holds
    safetensors), else none."""
    if flag_gib:
        if len(flag_gib) not in (1, world_size):
            raise FlagError(
                f"--weights-gib has {len(flag_gib)} values for {world_size} ranks; give one value for every "
                "rank, or one per rank"
            )
        values = list(flag_gib) * (world_size if len(flag_gib) == 1 else 1)
        return [RankWeightsFigure(v, flag_source) for v in values]
    if model_dir is None or layout is None:
        return [RankWeightsFigure(None, WeightsSource.NONE) for _ in range(world_size)]
    # start-up: as in checkpoint_weights (a layout is given only where a checkpoint may be read)
    from checker.core.checkpoint import has_safetensors
    from checker.core.weights import GIB

    if not has_safetensors(model_dir):
        return [RankWeightsFigure(None, WeightsSource.NONE) for _ in range(world_size)]
    mw, _ = checkpoint_weights(model_dir, layout, release=release, quantization=quantization)
    if len(mw.ranks) != world_size:
        raise ConfigError(
            f"the layout gives {len(mw.ranks)} ranks but the world has {world_size}; "
            "check --pp-size/--tp-size"
        )
    return [RankWeightsFigure(r.total_bytes / GIB, WeightsSource.CHECKPOINT, r) for r in mw.ranks]
