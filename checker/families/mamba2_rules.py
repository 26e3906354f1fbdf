"""The Mamba2 mixer's release rules shared by Nemotron-H, Falcon-H1 and Granite-4.0-H: its parameters per
rank, its checkpoint names, and the head checks of the configs with ``mamba_*`` keys."""

from __future__ import annotations

from collections.abc import Iterator

from checker.core.errors import LayoutError, shorten
from checker.core.releases.config_rules import Release
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.weights import (
    Builder,
    WeightsLayout,
    before,
    divide,
)


def mamba_mixer(
    b: Builder,
    pre: str,
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    n_groups: int,
    state: int,
    conv_kernel: int,
    conv_bias: bool,
    proj_bias: bool,
    rms_norm: bool,
    layout: WeightsLayout,
    release: str,
    cache_tp_size: int | None = None,
    quant: bool = True,
    module: str | None = None,
) -> int:
    """``MambaMixer2`` (``layers/attention/mamba/mamba.py``): over the attention-TP group under DP
    attention from 0.5.14 (the whole TP group before), else the TP group; a group count the group does
    not divide is replicated to it (``extra_groups_for_head_shards``: n_groups=1 becomes tp groups);
    ``quant``: the class hands the mixer its quant config (Falcon-H1's does not); ``module``: the mixer's
    SGLang module name where it is not ``pre`` (an ignore list or dynamic rule is matched against it)."""
    g = "attn_tp" if layout.dp_size > 1 and not before(release, "0.5.14") else "tp"
    size = b.p.size(g)
    divide(heads, size, "mamba heads")
    if n_groups % size and n_groups != 1:
        raise LayoutError(
            f"mamba n_groups = {n_groups} is neither 1 nor divisible by the TP size {size}; SGLang refuses it"
        )
    if quant and b.quant is not None and size > 1 and n_groups % size:
        # whatever the ignore list keeps bf16: the assertion reads the quant config only (0.5.23
        # layers/attention/mamba/mamba.py:254-259; the same from 0.5.5)
        raise LayoutError(
            f"mamba n_groups = {n_groups} is not divisible by the TP size {size} and the model is quantized; "
            f"SGLang {release} refuses it ('Tensor parallel currently supported for quantized models only if "
            "tensor parallel world size divides num groups', layers/attention/mamba/mamba.py:254-259), even "
            "where the ignore list keeps the mixer unquantized: use a TP size that divides n_groups"
        )
    groups = n_groups if n_groups % size == 0 else n_groups + (size - n_groups)
    # The channels come from the model config's mamba2_cache_params (0.5.3.post1+), whose extra groups
    # follow the attention-TP size; before 0.5.14 the mixer then splits them over the whole TP group
    # under attention DP (Falcon-H1 at tp 2 x dp 2 on 0.5.7: 2 groups' channels over 4 ranks).
    attn = cache_tp_size or b.p.attn_tp_size
    cache_groups = n_groups if n_groups % attn == 0 else n_groups + (attn - n_groups)
    conv_dim = intermediate + 2 * (cache_groups if not before(release, "0.5.3.post1") else groups) * state
    b.add(f"{pre}.A", (heads // size,), part="layers", dtype="float32")
    b.add(f"{pre}.D", (heads // size,), part="layers")
    b.add(f"{pre}.dt_bias", (heads // size,), part="layers")
    b.add(
        f"{pre}.conv1d.weight", (divide(conv_dim, size, "mamba conv channels"), 1, conv_kernel), part="layers"
    )
    if conv_bias:
        b.add(f"{pre}.conv1d.bias", (conv_dim // size,), part="layers")
    in_proj = intermediate + conv_dim + heads
    # merged (five logical shards) where the groups split evenly, one shard where they are replicated
    # (layers/attention/mamba/mamba.py: MergedColumnParallelLinear or ColumnParallelLinear)
    gs = cache_groups * state
    shards = [intermediate, intermediate, gs, gs, heads] if n_groups % size == 0 else None
    mod = module or pre
    b.column(
        f"{pre}.in_proj",
        in_proj,
        hidden,
        g,
        bias=proj_bias,
        shards=shards,
        quant=quant,
        prefix=f"{mod}.in_proj",
    )
    b.row(f"{pre}.out_proj", hidden, intermediate, g, bias=proj_bias, quant=quant, prefix=f"{mod}.out_proj")
    if rms_norm:
        b.add(f"{pre}.norm.weight", (divide(intermediate, size, "mamba intermediate size"),), part="layers")
    return groups  # the group count the mixer holds (n_groups, or the replicated one)


def mamba_tensors(
    pre: str,
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    groups: int,
    state: int,
    conv: int,
    conv_bias: bool,
    proj_bias: bool,
    rms_norm: bool,
) -> Iterator[tuple[str, Shape]]:
    conv_dim = intermediate + 2 * groups * state
    yield f"{pre}.A_log", (heads,)
    yield f"{pre}.D", (heads,)
    yield f"{pre}.dt_bias", (heads,)
    yield f"{pre}.conv1d.weight", (conv_dim, 1, conv)
    if conv_bias:
        yield f"{pre}.conv1d.bias", (conv_dim,)
    yield f"{pre}.in_proj.weight", (intermediate + conv_dim + heads, hidden)
    if proj_bias:
        yield f"{pre}.in_proj.bias", (intermediate + conv_dim + heads,)
    yield f"{pre}.out_proj.weight", (hidden, intermediate)
    if rms_norm:
        yield f"{pre}.norm.weight", (intermediate,)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_mamba_heads(
    r: Release,
    *,
    family: str,
    intermediate: object,
    intermediate_name: str,
    heads: object,
    head_dim: object,
    auto: bool = False,
) -> None:
    """``intermediate`` must split into ``heads`` heads of ``head_dim`` (``auto``: the class takes "auto"
    as whatever divides)."""
    if not (is_number(intermediate) and isinstance(heads, int) and not isinstance(heads, bool) and heads > 0):
        return  # a size that is not one: the geometry reader names it
    if r.has(f"{family}.heads_divide") and intermediate % heads:  # type: ignore[operator]
        raise r.refuse(
            f"{family}.heads_divide",
            "mamba_n_heads",
            heads,
            f"does not divide {intermediate_name} = {shorten(intermediate)}",
        )
    if (auto and head_dim == "auto") or not r.has(f"{family}.head_dim"):
        return
    if not (is_number(head_dim) or isinstance(head_dim, str)):
        return  # a list or an object: the geometry reader names it
    if head_dim * heads != intermediate:  # type: ignore[operator]  # a string repeats: SGLang's ValueError too
        raise r.refuse(
            f"{family}.head_dim",
            "mamba_d_head",
            head_dim,
            f"* mamba_n_heads={heads} is not {intermediate_name} = {shorten(intermediate)}",
        )
