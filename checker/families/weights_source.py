"""Where each rank's weights figure comes from, and the figure itself (torch-free).

The budget SGLang gives a rank (``--budget-from-device``, ``plan``'s fraction) is free memory after the
weights; the weights figure per rank is, by precedence:

* ``flag``: ``--weights-gib`` (one value for every rank, or one per rank), when given;
* ``log``: ``--weights-from-log`` (check, plan): the figures an earlier start's server logged;
* ``checkpoint``: the model directory's safetensors checkpoint beside its config.json, read from the
  shard headers (:mod:`checker.core.weights.checkpoint`), checked against config.json
  (:mod:`checker.core.weights.checkpoint_names`), and held as the release's class holds it
  (:mod:`checker.core.weights.weights`): parameters exactly, plus the stated margin (buffers, kept copies,
  allocator segments);
* ``config``: a model directory with config.json and no shards: the same figure from config.json alone
  (the release's class decides the bytes, not the checkpoint), so a budget is never sized on free memory
  with the weights missing; a family whose weights are not modelled is refused there in one line;
* none: no flag and no model directory (a preset, a JSON model spec).

:class:`WeightsSource` is the small enum the report carries; a later source (the server's own log line)
adds a member.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checker.core.errors import ConfigError, FlagError
from checker.core.sizing.models import MAX_CONFIG_BYTES, read_json, shown_path

if TYPE_CHECKING:
    from checker.core.weights.checkpoint import Checkpoint
    from checker.core.weights.weights import ModelWeights, RankWeights, WeightsLayout


class WeightsSource(enum.IntEnum):
    """Where a rank's weights figure came from. Integer values go on the wire (a rank row)."""

    NONE = 0
    FLAG = 1
    CHECKPOINT = 2
    LOG = 3
    CONFIG = 4

    @property
    def label(self) -> str:
        return {0: "none", 1: "flag", 2: "checkpoint", 3: "log", 4: "config"}[int(self)]

    @property
    def words(self) -> str:
        """Where the figure came from, in a report's words."""
        return {
            0: "no weights figure",
            1: "--weights-gib",
            2: "the checkpoint",
            3: "--weights-from-log",
            4: "config.json (no shards)",
        }[int(self)]


class DraftSource(enum.IntEnum):
    """Where a rank's speculative draft bytes came from (``draft_source`` beside ``draft_bytes``). Integer
    values go on the wire (a rank row); NONE: the rank loads no draft (JSON null)."""

    NONE = 0
    TARGET_MTP = 1
    """The NEXTN/MTP layer in the target's checkpoint: its class, held to the mtp.* tensors the shard
    headers name."""
    TARGET_CONFIG = 2
    """That class from the target's config.json alone (no shards)."""
    CHECKPOINT = 3
    """A separate draft (--speculative-draft-model-path): its class, held to its shards' headers."""
    CONFIG = 4
    """A separate draft's class from its config.json alone (no shards)."""
    WEIGHTS_GIB = 5
    """Inside the figure --weights-gib gave (not a part of its own)."""
    LOG = 6
    """Inside the figures --weights-from-log read."""
    AFTER_POOL = 7
    """The rank loads a draft, but the release sizes its pool before it (before 0.5.14): not charged."""

    @property
    def label(self) -> str | None:
        return _DRAFT_LABELS[int(self)]


_DRAFT_LABELS = (
    None,
    "target-mtp",
    "target-config",
    "checkpoint",
    "config",
    "weights-gib",
    "log",
    "after-pool",
)
DRAFT_SOURCE_LABELS = tuple(x for x in _DRAFT_LABELS if x is not None)
"""The ``draft_source`` values a JSON document carries (besides null)."""


@dataclass(frozen=True)
class RankWeightsFigure:
    """One rank's weights figure and where it came from (``detail``: the checkpoint's parts, when read;
    ``draft_source``: where its speculative draft's bytes came from, NONE where it loads none)."""

    gib: float | None
    source: WeightsSource
    detail: RankWeights | None = None
    draft_source: DraftSource = DraftSource.NONE


def draft_words(source: DraftSource, draft_bytes: int | None) -> str:
    """The draft's part of a rank's figure in a report's words ("draft 3.51 GiB from target-mtp"); "" where
    the rank loads no draft."""
    if source == DraftSource.NONE:
        return ""
    if source in (DraftSource.WEIGHTS_GIB, DraftSource.LOG):
        return f"draft inside the figure ({source.label})"
    if source == DraftSource.AFTER_POOL:
        return "draft loaded after the pool is sized (after-pool)"
    return f"draft {(draft_bytes or 0) / 2**30:.2f} GiB from {source.label}"


def draft_sources(layout: WeightsLayout | None, world_size: int, kind: DraftSource) -> list[DraftSource]:
    """Each rank's :class:`DraftSource`: ``kind`` on the ranks that load the draft (under PP the last
    stage's: 0.5.23 ``managers/scheduler.py:1042-1051``; every rank at pp 1), NONE elsewhere or without
    a draft."""
    if layout is None or layout.draft is None:
        return [DraftSource.NONE] * world_size
    last = (layout.pp_size - 1) * layout.tp_group
    return [kind if rank >= last else DraftSource.NONE for rank in range(world_size)]


def busiest_rank(figures: Sequence[RankWeightsFigure]) -> int | None:
    """The rank with the largest known weights figure (the lowest such rank on a tie): the one whose
    free memory after loading bounds the budget (SGLang all-reduces free memory MIN over ranks). None
    where no figure is known (no checkpoint, no flag)."""
    known = [(f.gib, i) for i, f in enumerate(figures) if f.gib is not None]
    return max(known, key=lambda k: (k[0], -k[1]))[1] if known else None


HF_QUANT_CONFIG = "hf_quant_config.json"
"""ModelOpt's file beside config.json: SGLang reads a quantization from it where config.json declares none
(0.5.23 ``configs/model_config.py`` ``_parse_quant_hf_config``; 0.5.2 takes its mere presence as
ModelOpt's)."""


def _modelopt(path: Path) -> Mapping[str, Any]:
    """``hf_quant_config.json``, read as SGLang's ``json.load`` reads it (one that fails: one line)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_CONFIG_BYTES else None
    except (OSError, ValueError, RecursionError) as exc:  # SGLang's json.load fails on it: no server
        why = getattr(exc, "strerror", None) or (
            str(exc) if isinstance(exc, ValueError) else "nested too deep"
        )
        raise FlagError(
            f"{shown_path(path)}: not JSON SGLang can read ({why}); SGLang reads {HF_QUANT_CONFIG} beside "
            "config.json as the model's quantization, and fails on this one"
        ) from None
    if not isinstance(doc, Mapping):
        raise FlagError(
            f"{shown_path(path)}: not a JSON object of at most {MAX_CONFIG_BYTES >> 20} MiB; SGLang reads "
            f"{HF_QUANT_CONFIG} beside config.json as the model's quantization"
        )
    return doc


def with_hf_quant_config(config: Mapping[str, Any], d: Path) -> Mapping[str, Any]:
    """``config`` with the ``hf_quant_config.json`` beside it where config.json declares no quantization
    (SGLang reads the file then: ``_parse_quant_hf_config``, 0.5.23 configs/model_config.py:1806-1812),
    under the key :mod:`checker.core.weights.quant` reads it from."""
    # start-up: as in checkpoint_weights (the weights modules load only where a model directory is read)
    from checker.core.weights.quant import HF_QUANT_KEY

    declared = config.get("quantization_config") or config.get("compression_config")
    if declared is None and (d / HF_QUANT_CONFIG).exists():
        return {**config, HF_QUANT_KEY: _modelopt(d / HF_QUANT_CONFIG)}
    return config


def checkpoint_weights(
    directory: str | Path,
    layout: WeightsLayout,
    *,
    release: str,
    quantization: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[ModelWeights, Checkpoint]:
    """Every rank's weights for ``layout`` from the checkpoint in ``directory`` (config.json beside it).

    Refused in one line: a quantized model (``quantization_config`` or ``compression_config`` in
    config.json, a ``hf_quant_config.json`` beside it, ``--quantization``, or float8 tensors under a config
    that declares nothing): its held weights are not modelled; a tensor the class has no parameter for
    where its ``load_weights`` raises on one (Falcon-H1); a family the checker does not model; a checkpoint
    whose tensors contradict config.json or whose shards are broken (:func:`read_checkpoint`)."""
    # start-up: the checkpoint reader and the weights rules load only when a
    # checkpoint is read; every rank imports this module for WeightsSource and weights_per_rank
    from checker.core.weights.checkpoint import read_checkpoint
    from checker.core.weights.checkpoint_names import (  # start-up: as above
        check_compressed,
        check_fp8,
        check_packed,
        check_unquantized,
        check_unquantized_modules,
    )
    from checker.core.weights.quant import read_scheme  # start-up: as above
    from checker.core.weights.weights import check_quant_family  # start-up: as above
    from checker.families.drafts import check_mtp_shards  # start-up: as above
    from checker.families.rules import (  # start-up: as above
        check_complete,
        check_loadable,
        check_shapes,
        expected_shapes,
        family_of,
        model_weights,
    )

    d = Path(directory)
    if config is None:
        config = read_json(d / "config.json")
    source = str(d / "config.json")
    # the quantization SGLang reads (config.json, hf_quant_config.json, --quantization): FP8 modelled, the
    # rest refused in one line naming it, before any shard is read
    config = with_hf_quant_config(config, d)  # one that SGLang's json.load fails on is refused as such
    scheme = read_scheme(config, flag=quantization, directory=d, source=source)
    if quantization:
        layout = dataclasses.replace(layout, quantization=quantization)
    fam, _, _ = family_of(config, source)  # an unmodelled family is refused before any shard is read
    check_quant_family(fam, scheme, source)  # and a method its class is not modelled under
    ckpt = read_checkpoint(d)
    view = ckpt  # what the config-shape checks see (NVFP4's packed weights at their [out, in])
    if scheme is not None:  # a module its class builds unquantized under every method (Qwen3.5's tower)
        for prefix, what in fam.unquantized:
            check_unquantized_modules(ckpt, (prefix,), what, source, scheme.describe())
    if scheme is None:  # quantized tensors under a config that declares none: named before the name checks
        check_unquantized(ckpt, source)
    elif scheme.gq is not None:
        from checker.core.weights.gptq import check_gptq_shards  # start-up: as above

        # the packed tensors held to the config; the checks below see each module's logical weight
        ckpt = view = check_gptq_shards(
            ckpt, expected_shapes(config, source), scheme.gq, fam.hf_prefixes, source
        )
    elif scheme.aw is not None:
        from checker.core.weights.awq import check_awq_shards  # start-up: as above

        ckpt = view = check_awq_shards(
            ckpt, expected_shapes(config, source), scheme.aw, fam.hf_prefixes, source, fam.packed_modules
        )
    elif scheme.ct is not None and scheme.ct.weight_only():
        kinds = {
            (
                g.weights.num_bits,
                -1 if g.weights.strategy == "channel" else g.weights.group_size or -1,
                g.weights.symmetric,
                g.weights.actorder,
            )
            for _, g in scheme.ct.targets
        }
        one = next(iter(kinds)) if len(kinds) == 1 else None
        args = None if one is None else (one[0], one[1], one[2], one[3] in ("group", "dynamic"))
        check_packed(ckpt, expected_shapes(config, source), args, source)
    elif scheme.ct is not None:
        ct = scheme.ct
        ct.refuse_unresolved()
        blocks = {g.weights.block for _, g in ct.targets if g.weights.strategy == "block"}
        static = bool(ct.targets) and all(
            g.inputs is not None and not g.inputs.dynamic for _, g in ct.targets
        )
        check_compressed(ckpt, ct.strategies(), next(iter(blocks), None), static, source)
    elif scheme.fp4 is not None:
        from checker.core.weights.modelopt import check_fp4_shards  # start-up: as above

        # packed NVFP4 weights are held to [out, in/2] with their scales, then to config.json as [out, in]
        _, logical = check_fp4_shards(ckpt.tensors, expected_shapes(config, source), scheme.fp4.group, source)
        tensors = {**ckpt.tensors, **{n: ckpt.tensors[n]._replace(shape=sh) for n, sh in logical.items()}}
        view = dataclasses.replace(ckpt, tensors=tensors)
    else:
        check_fp8(ckpt, scheme.block, source)
    check_shapes(view, config, source)
    check_loadable(view, config, release=release, source=source)  # as load_weights fails: KeyError first
    check_complete(view, config, source)  # a parameter no shard fills: the class starts uninitialized
    if scheme is None:
        if layout.draft == "nextn":  # the draft EAGLE/NEXTN loads from these shards' mtp.* tensors
            check_mtp_shards(ckpt, config, release=release, source=source)
    return model_weights(config, layout, release=release, source=source), ckpt


def config_weights(
    directory: str | Path, layout: WeightsLayout, *, release: str, quantization: str | None = None
) -> ModelWeights:
    """Every rank's weights for ``layout`` from ``directory``'s config.json alone (no shards beside it):
    the same figure the checkpoint gives, since the release's class decides the bytes. The quantization
    is read as :func:`checkpoint_weights` reads it (config.json, ``hf_quant_config.json``,
    ``--quantization``); a family the checker does not model is refused in one line."""
    # start-up: as in checkpoint_weights (the weights rules load only for a figure)
    from checker.core.weights.quant import read_scheme
    from checker.families.rules import family_of, model_weights

    d = Path(directory)
    source = shown_path(d / "config.json")
    config = with_hf_quant_config(read_json(d / "config.json"), d)
    read_scheme(config, flag=quantization, directory=d, source=source)
    if quantization:
        layout = dataclasses.replace(layout, quantization=quantization)
    family_of(config, source)
    return model_weights(config, layout, release=release, source=source)


def weights_per_rank(
    *,
    flag_gib: Sequence[float],
    flag_source: WeightsSource = WeightsSource.FLAG,
    world_size: int,
    model_dir: str | Path | None,
    layout: WeightsLayout | None,
    release: str,
    quantization: str | None = None,
    required: bool = True,
) -> list[RankWeightsFigure]:
    """Every rank's weights figure, by precedence: ``--weights-gib`` (or the figures of
    ``--weights-from-log``: ``flag_source`` LOG), else the checkpoint in ``model_dir`` (when it holds
    safetensors), else ``model_dir``'s config.json alone (source CONFIG), else none (no model directory).
    ``required`` False (a picture that shows the weights where known): a family whose weights are not
    modelled gets none instead of the one-line refusal. The draft's rules (:func:`check_draft_setup`) hold
    whatever the figure's source: a figure given as a number does not make a broken draft start."""
    if layout is not None:
        check_draft_setup(
            model_dir, layout, release=release, quantization=quantization, target_read=not flag_gib
        )
    if flag_gib:
        if len(flag_gib) not in (1, world_size):
            raise FlagError(
                f"--weights-gib has {len(flag_gib)} values for {world_size} ranks; give one value for every "
                "rank, or one per rank"
            )
        values = list(flag_gib) * (world_size if len(flag_gib) == 1 else 1)
        inside = DraftSource.LOG if flag_source == WeightsSource.LOG else DraftSource.WEIGHTS_GIB
        drafts = draft_sources(layout, world_size, inside)
        return [RankWeightsFigure(v, flag_source, None, d) for v, d in zip(values, drafts, strict=True)]
    if model_dir is None or layout is None:
        return [RankWeightsFigure(None, WeightsSource.NONE) for _ in range(world_size)]
    # start-up: as in checkpoint_weights (a layout is given only where a checkpoint may be read)
    from checker.core.weights.checkpoint import has_safetensors
    from checker.core.weights.weights import GIB

    source = WeightsSource.CHECKPOINT
    if has_safetensors(model_dir):
        mw, _ = checkpoint_weights(model_dir, layout, release=release, quantization=quantization)
    elif not (Path(model_dir) / "config.json").is_file():
        return [RankWeightsFigure(None, WeightsSource.NONE) for _ in range(world_size)]
    else:
        if not required and not _modelled(Path(model_dir) / "config.json"):
            return [RankWeightsFigure(None, WeightsSource.NONE) for _ in range(world_size)]
        mw, source = (
            config_weights(model_dir, layout, release=release, quantization=quantization),
            WeightsSource.CONFIG,
        )
    if len(mw.ranks) != world_size:
        raise ConfigError(
            f"the layout gives {len(mw.ranks)} ranks but the world has {world_size}; "
            "check --pp-size/--tp-size"
        )
    drafts = draft_sources(layout, world_size, _computed_draft(model_dir, layout, release))
    return [
        RankWeightsFigure(r.total_bytes / GIB, source, r, d) for r, d in zip(mw.ranks, drafts, strict=True)
    ]


def _computed_draft(model_dir: str | Path, layout: WeightsLayout, release: str) -> DraftSource:
    """Where a computed figure's draft bytes came from: the target's NEXTN/MTP layer or a separate
    draft, from shards held to its class or from config.json alone; AFTER_POOL where the release loads
    the draft after sizing its pool."""
    # start-up: as in checkpoint_weights (called only where a figure was computed)
    from checker.core.weights.checkpoint import has_safetensors
    from checker.core.weights.weights import FIRST_DRAFT_IN_BUDGET, before

    if layout.draft is None:
        return DraftSource.NONE
    if before(release, FIRST_DRAFT_IN_BUDGET):
        return DraftSource.AFTER_POOL
    if layout.draft == "separate" and layout.draft_path is not None:
        return DraftSource.CHECKPOINT if has_safetensors(layout.draft_path) else DraftSource.CONFIG
    return DraftSource.TARGET_MTP if has_safetensors(model_dir) else DraftSource.TARGET_CONFIG


def check_draft_setup(
    model_dir: str | Path | None,
    layout: WeightsLayout,
    *,
    release: str,
    quantization: str | None = None,
    target_read: bool,
) -> None:
    """The speculative draft's rules that do not depend on where the weights figure comes from (the
    checkpoint, config.json, --weights-gib, --weights-from-log): a separate draft directory SGLang cannot
    build or load (:func:`check_draft_dir`); EAGLE/NEXTN on a target no release has a NEXTN class for
    (:func:`check_nextn_class`); and, where the target's own shards are not read for the figure
    (``target_read`` False: a figure given as a number), the ``mtp.*`` tensors the draft loads from them
    held to its class from the headers (an unquantized target only, as :func:`checkpoint_weights` holds
    them). One line each (FlagError/ConfigError)."""
    if layout.draft == "separate" and layout.draft_path is not None:
        check_draft_dir(layout.draft_path, release=release)
    if layout.draft != "nextn" or model_dir is None or not (Path(model_dir) / "config.json").is_file():
        return
    check_nextn_class(Path(model_dir) / "config.json", release=release)
    if not target_read:
        _hold_mtp_shards(Path(model_dir), release=release, quantization=quantization)


def _hold_mtp_shards(d: Path, *, release: str, quantization: str | None) -> None:
    """The target's ``mtp.*`` tensors held to the family's NEXTN/MTP class from the shard headers alone
    (checker.families.drafts.check_mtp_shards), where the target declares no quantization."""
    # start-up: as in checkpoint_weights (the checkpoint reader loads only where shards are held)
    from checker.core.weights.checkpoint import has_safetensors, read_checkpoint
    from checker.families.drafts import check_mtp_shards

    if quantization or not has_safetensors(d):
        return
    try:
        config = read_json(d / "config.json")
    except ConfigError:
        return  # not a config SGLang reads: the derivation refuses it in its own words
    declared = config.get("quantization_config") or config.get("compression_config")
    if declared is not None or (d / HF_QUANT_CONFIG).exists():
        return
    check_mtp_shards(read_checkpoint(d), config, release=release, source=shown_path(d / "config.json"))


def check_draft_dir(path: str, *, release: str) -> None:
    """A separate draft (``--speculative-draft-model-path``) must be a model directory the checker reads:
    SGLang builds the draft from its config.json; its shards, where it holds any, are held to the class
    (checker.families.drafts.check_draft_checkpoint). One line where not (FlagError/ConfigError)."""
    # start-up: as in checkpoint_weights (the weights rules load only where a figure is asked for)
    from checker.families.drafts import check_draft_checkpoint, check_draft_release, read_draft_config

    config = read_draft_config(path)
    check_draft_release(config, release=release, source=shown_path(Path(path) / "config.json"))
    check_draft_checkpoint(path, release=release)


def check_nextn_class(path: Path, *, release: str) -> None:
    """EAGLE/NEXTN without a separate draft on a family for which no release has a NEXTN/MTP class
    (checker.families.drafts.check_nextn_family): one line."""
    # start-up: as in check_draft_dir
    from checker.families.drafts import check_nextn_family

    try:
        config = read_json(path)
    except ConfigError:
        return  # the figure's own reading refuses it in one line
    archs = config.get("architectures")
    archs = [str(a) for a in archs] if isinstance(archs, list) else []
    check_nextn_family(archs, config, release=release, source=shown_path(path))


def _modelled(path: Path) -> bool:
    """Whether the config's family has its weights modelled (an unreadable config: True, so that the
    figure's own reading refuses it in one line)."""
    # start-up: the family registry loads only where a config-only figure is optional (derive --plot)
    from checker.families import family_for

    try:
        model_type = read_json(path).get("model_type")
    except ConfigError:
        return True
    family = family_for(model_type if isinstance(model_type, str) else "")
    return family is None or family.rules().weights is not None
