"""The sizing inputs, one table: every flag a derivation reads, by SGLang's server-arg name (torch-free).

Each field of :class:`SizingFlags` is one row of the table: its type and default are the field's, and its
metadata (:class:`ServerArg`) says what a value must be, the help text, and how SGLang's launch command
spells it. Everything else follows from the table, none of it lists the inputs again:

* the checker's flags: ``checker.commands.options.add_layout_args`` and ``add_flag_args`` add one argparse
  option per row, typed and checked by the row;
* the typed config: :class:`SizingFlags` itself, every field checked by its row when it is built (a
  value of the wrong type is a bug and raises TypeError: a list never lands in a scalar field);
* the core's inputs: :class:`checker.core.sizing.sizing.CapacityInputs` extends :class:`SizingFlags` with what
a
  rank knows (geometry, budget, release, environment);
* the launch-command mapping (``checker.launch.merge``): the rows with an SGLang spelling
  (:data:`LAUNCH_ARGS`), whose launch values the same row checks, naming the launch command's flag.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from checker.core.errors import CheckerInputError, FlagError, LayoutError, shorten
from checker.core.sizing.geometry import canonical_dtype

POLICIES = ("max-share", "own-share", "whole-model")
STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
MAX_PARALLEL = 1024
"""--pp/--tp/--dp sizes above this are no deployment (and a single-process derive walks every stage)."""
MAX_MEMORY_RATIO = 1000.0
"""--mamba-full-memory-ratio above this leaves the KV pool under 0.1% of the budget: not a setting."""

_KINDS = (bool, int, float, str)


@dataclass(frozen=True, kw_only=True)
class ServerArg:
    """One row of the table: a sizing input, what a value must be, and where a user gives it."""

    name: str
    """The field's name: SGLang's ServerArgs name, except ``context_len`` (SGLang's ``context_length``)."""
    kind: type
    """bool, int, float or str: what a value is (a float input also takes an int, as Python does)."""
    optional: bool
    """Whether None (unset: the release, the layout or the model decides) is a value."""
    default: object
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    low: float | None = None
    """The smallest value: inclusive for an int, exclusive for a float."""
    high: float | None = None
    """The largest value, inclusive."""
    unit: str = ""
    """Said after a float's range in a refusal (" (a fraction of free memory)")."""
    dtype: bool = False
    """A state dtype name, checked as SGLANG_MAMBA_SSM_DTYPE is (empty is not unset)."""
    sglang: str | None = None
    """The ServerArgs field a launch command gives this input as (None: not a server arg)."""
    sglang_zero_is_unset: bool = False
    """SGLang reads a launch value of 0 as unset (``if not value:`` where it applies its default)."""
    error: type[CheckerInputError] = FlagError
    layout: bool = False
    """One of the parallel sizes (pp, tp, dp): its own argparse group and a LayoutError."""

    @property
    def flag(self) -> str:
        """The checker's flag: ``--`` and the field name with dashes."""
        return "--" + self.name.replace("_", "-")

    @property
    def sglang_flag(self) -> str | None:
        """How a launch command spells it (its canonical spelling; aliases parse to the same field)."""
        return None if self.sglang is None else "--" + self.sglang.replace("_", "-")

    def refusal(self, value: object, *, shown: str | None = None) -> str | None:
        """Why ``value`` (of this row's kind) is not a value of this input, as "VALUE must be ..." (None
        when it is one). ``shown``: how the value reads in the message (the text the user typed)."""
        if value is None:
            return None  # whether unset is a value is check_type's question
        text = shown if shown is not None else _shown(value)
        if self.choices is not None and value not in self.choices:
            return f"{text} is not one of {', '.join(self.choices)}"
        if self.dtype:
            try:
                canonical_dtype(value, source="value")
            except CheckerInputError as exc:
                return str(exc).replace("value=", "", 1)
            return None
        if self.kind is int:
            assert isinstance(value, int)
            if self.low is not None and value < self.low:
                at_least = "a positive integer" if self.low == 1 else f"at least {self.low:g}"
                return f"{text} must be {at_least}"
            if self.high is not None and value > self.high:
                return f"{text} must be at most {self.high:,.0f}"
        if self.kind is float:
            assert isinstance(value, (int, float))
            if not math.isfinite(value):
                return f"{text} must be a finite number"
            low = -math.inf if self.low is None else self.low
            high = math.inf if self.high is None else self.high
            if not low < value <= high:
                return f"{text} must be in ({low:g}, {high:,.0f}]{self.unit}"
        return None

    def check_type(self, value: object) -> None:
        """TypeError unless ``value`` is of this row's kind (or None where unset is a value): the
        parsers and the launch-command merge hand over typed values, so a mismatch is a bug."""
        if value is None and self.optional:
            return
        ok = isinstance(value, self.kind) and (self.kind is bool or not isinstance(value, bool))
        if self.kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise TypeError(
                f"{self.name}={shorten(value)} is a {type(value).__name__}, not a {self.kind.__name__}"
                + (" or None" if self.optional else "")
            )

    def check(self, value: object, *, flag: str | None = None) -> None:
        """Refuse ``value`` as this row's error, naming ``flag`` (default: the checker's flag)."""
        self.check_type(value)
        problem = self.refusal(value)
        if problem is not None:
            raise self.error(f"{flag or self.flag} {problem}")

    def launch_value(self, value: object) -> object:
        """A launch command's value as SGLang reads it (0 is unset where SGLang says so), refused as the
        checker's flag would be, naming the launch command's flag."""
        if self.sglang_zero_is_unset and value == 0 and not isinstance(value, bool):
            return None
        try:
            self.check_type(value)
        except TypeError:
            raise FlagError(
                f"launch command {self.sglang_flag} {shorten(value)}: not a {self.kind.__name__}"
            ) from None
        self.check(value, flag=f"launch command {self.sglang_flag}")
        return value


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _arg(default: object, **row: Any) -> Any:
    """A :class:`SizingFlags` field: its default, and the rest of its row as metadata."""
    return field(default=default, metadata={"server_arg": row})


def _positive(**row: Any) -> dict[str, Any]:
    return {"low": 1, **row}


def _parallel(**row: Any) -> dict[str, Any]:
    return {"low": 1, "high": MAX_PARALLEL, "error": LayoutError, "layout": True, **row}


@dataclass(frozen=True, kw_only=True)
class SizingFlags:
    """Every flag a rank's derivation reads, by SGLang's name: each one is a preflight input."""

    pp_size: int | None = _arg(None, **_parallel(sglang="pp_size", help="pipeline-parallel size P"))
    """None: world_size // (tp_size x dp_size) under torchrun; the command's default elsewhere."""
    tp_size: int = _arg(1, **_parallel(sglang="tp_size", help="attention TP size (default 1)"))
    """Attention TP: a launch command's --tp-size divided by its attention DP size."""
    dp_size: int = _arg(1, **_parallel(sglang="dp_size", help="attention DP size (default 1)"))
    """Attention data-parallel size: K and max_running_requests are per dp worker."""

    @property
    def tp_group_size(self) -> int:
        """SGLang's own --tp-size: the ranks of one pipeline stage, attention TP x attention DP (the
        inner dimension of the world: pp_rank = rank // tp_group_size)."""
        return self.tp_size * self.dp_size

    policy: str | None = _arg(
        None,
        choices=POLICIES,
        help="how a stage is charged for state (default: the release's own: whole-model up to "
        "SGLang 0.5.16, max-share from 0.5.17); own-share is the rejected alternative, for what-ifs",
    )
    """Charging policy; None: the release's own (whole-model up to 0.5.16, max-share from 0.5.17). The
    three policies stay available as what-if options on any release."""
    mamba_full_memory_ratio: float | None = _arg(
        None,
        low=0,
        high=MAX_MEMORY_RATIO,
        metavar="R",
        sglang="mamba_full_memory_ratio",
        help="r: the state pool's share is r/(1+r) of the budget (default: the release's, 0.9)",
    )
    """r: the state pool gets r / (1 + r) of the budget in the auto-fit branch. None: the release's own
    default (0.9; 0.2 in SGLang 0.5.3.post2)."""
    mamba_radix_cache_strategy: str = _arg(
        "auto",
        choices=STRATEGIES,
        sglang="mamba_radix_cache_strategy",
        help="default auto: extra_buffer unless --disable-overlap-schedule with page_size 1 "
        "(then no_buffer); under pp > 1 extra_buffer runs without overlap: 4 slots. "
        "An explicit no_buffer needs --disable-overlap-schedule and page_size 1, as in SGLang",
    )
    page_size: int = _arg(
        1, **_positive(metavar="N", sglang="page_size", help="KV cache page size in tokens (default 1)")
    )
    attention_backend: str | None = _arg(
        None,
        metavar="NAME",
        sglang="attention_backend",
        help="SGLang's --attention-backend: one that forces a page size (flashmla, trtllm_mha, ...) changes "
        "--page-size as the release does (default: the GPU's, assumed to force none)",
    )
    """The four backend flags as given; the page size they make the release use:
    :mod:`checker.core.sizing.page_size` (the release's choices are checked there)."""
    decode_attention_backend: str | None = _arg(
        None, metavar="NAME", sglang="decode_attention_backend", help="SGLang's --decode-attention-backend"
    )
    prefill_attention_backend: str | None = _arg(
        None, metavar="NAME", sglang="prefill_attention_backend", help="SGLang's --prefill-attention-backend"
    )
    speculative_draft_attention_backend: str | None = _arg(
        None,
        metavar="NAME",
        sglang="speculative_draft_attention_backend",
        help="SGLang's --speculative-draft-attention-backend",
    )
    disable_radix_cache: bool = _arg(
        False, sglang="disable_radix_cache", help="no prefix cache: 1 state slot per request"
    )
    disable_overlap_schedule: bool = _arg(
        False, sglang="disable_overlap_schedule", help="(forced on by SGLang whenever pp size > 1)"
    )
    max_running_requests: int | None = _arg(
        None,
        **_positive(
            metavar="N",
            sglang="max_running_requests",
            help="cap on running requests (SGLang's flag); with --disable-radix-cache it sizes the pool",
        ),
    )
    max_mamba_cache_size: int | None = _arg(
        None,
        **_positive(
            metavar="K",
            sglang="max_mamba_cache_size",
            help="an explicit state pool size K (skips the auto-fit)",
        ),
    )
    pp_max_micro_batch_size: int | None = _arg(
        None,
        **_positive(
            metavar="N",
            sglang="pp_max_micro_batch_size",
            # managers/scheduler.py Scheduler.__init__: ``if not pp_max_micro_batch_size:`` the default.
            sglang_zero_is_unset=True,
            help="cap on the micro-batch size under pp (default: max_running_requests // pp_size)",
        ),
    )
    speculative_num_draft_tokens: int | None = _arg(
        None,
        **_positive(
            metavar="D",
            sglang="speculative_num_draft_tokens",
            help="spec decoding draft tokens; alone (no --speculative-algorithm): speculative decoding "
            "with D draft tokens, which needs --max-running-requests",
        ),
    )
    speculative_algorithm: str | None = _arg(
        None,
        metavar="ALG",
        sglang="speculative_algorithm",
        help="spec decoding on, as SGLang resolves it (EAGLE, EAGLE3, NEXTN, STANDALONE): unset steps, "
        "top-k, draft tokens and --max-running-requests get the release's own values",
    )
    """The algorithm as given (checker.core.releases.startup resolves the setup per release; None: no
    algorithm)."""
    speculative_num_steps: int | None = _arg(
        None, **_positive(metavar="N", sglang="speculative_num_steps", help="spec decoding draft steps")
    )
    speculative_eagle_topk: int | None = _arg(
        None, **_positive(metavar="K", sglang="speculative_eagle_topk", help="spec decoding top-k per step")
    )
    enable_linear_replayssm_spec: bool = _arg(
        False,
        sglang="enable_linear_replayssm_spec",
        help="the ReplaySSM spec-verify ring (GDN and KDA models, SGLang 0.5.17+): charged instead of the "
        "speculative intermediate state",
    )
    """checker.core.sizing.replay: what each release charges for the ring
    (0.5.16's --enable-gdn-replayssm-spec
    charges nothing)."""
    linear_replayssm_cache_len: int | None = _arg(
        None,
        low=0,
        metavar="L",
        sglang="linear_replayssm_cache_len",
        help="the ReplaySSM ring's length (default: the release's, 16)",
    )
    mamba_ssm_dtype: str | None = _arg(
        None,
        dtype=True,
        metavar="DTYPE",
        sglang="mamba_ssm_dtype",
        help="temporal state dtype (float32, bfloat16, float16); sets SGLANG_MAMBA_SSM_DTYPE",
    )
    """The flag as given; the geometry's temporal dtype is resolved from it (``geometry.resolve_dtypes``)."""
    token_capacity: int | None = _arg(
        None,
        **_positive(
            metavar="T",
            help="the tokens one stage's KV pool holds, in place of what its KV bytes give (the profile); "
            "--max-total-tokens, --page-size and the MIN over stages still apply (default: derived)",
        ),
    )
    """Overrides every stage's profiled KV capacity (the tokens its KV bytes hold); None: derived."""
    kv_cache_dtype: str = _arg(
        "auto",
        metavar="DTYPE",
        sglang="kv_cache_dtype",
        help="KV cache element type (SGLang's flag: auto = the model's dtype, fp8_e4m3, fp8_e5m2, bf16, "
        "...; the release's parser decides which it takes)",
    )
    """Checked against the release's own choices when sizing (checker.core.sizing.kv_pool.kv_dtype_bytes)."""
    max_total_tokens: int | None = _arg(
        None,
        metavar="N",
        sglang="max_total_tokens",
        help="cap on every stage's KV pool in tokens (SGLang's flag; default: what the memory gives)",
    )
    """Unbounded here: SGLang takes any integer, and a value <= 0 is the release's own refusal at start-up
    (checker.core.sizing.kv_pool)."""
    context_len: int | None = _arg(
        None,
        **_positive(
            metavar="N",
            sglang="context_length",
            help="context length for the running-request estimate (default: the config's)",
        ),
    )

    def __post_init__(self) -> None:
        for row in SIZING_ARGS:
            row.check(getattr(self, row.name))

    @classmethod
    def from_args(cls, args: object, **given: object) -> SizingFlags:
        """The flags of a parsed command line (an ``argparse.Namespace`` with one attribute per row, as
        ``checker.commands.options`` adds them); ``given`` replaces the fields a command reads its own way
        (the sweep's repeatable --policy is a list of policies, not this field)."""
        values = {row.name: getattr(args, row.name) for row in SIZING_ARGS}
        return cls(**{**values, **given})


def _rows() -> tuple[ServerArg, ...]:
    hints = typing.get_type_hints(SizingFlags)
    rows = []
    for f in fields(SizingFlags):
        kinds = [k for k in typing.get_args(hints[f.name]) if k is not type(None)] or [hints[f.name]]
        assert len(kinds) == 1 and kinds[0] in _KINDS, f"{f.name}: one of {_KINDS}"
        rows.append(
            ServerArg(
                name=f.name,
                kind=kinds[0],
                optional=type(None) in typing.get_args(hints[f.name]),
                default=f.default,
                **f.metadata["server_arg"],
            )
        )
    return tuple(rows)


SIZING_ARGS: tuple[ServerArg, ...] = _rows()
"""The table, in field order (the order of the inputs in the report and of the flags in --help)."""
SIZING_FLAG_NAMES = tuple(row.name for row in SIZING_ARGS)
SIZING_ARG = {row.name: row for row in SIZING_ARGS}

# Launch-command inputs that are not sizing flags: the model, and the fraction of free memory the
# budget is (``check --budget-from-device``).
MODEL_PATH = ServerArg(
    name="model_config", kind=str, optional=True, default=None, help="", sglang="model_path"
)
MEM_FRACTION_STATIC = ServerArg(
    name="mem_fraction_static",
    kind=float,
    optional=False,
    default=0.9,
    low=0,
    high=1.0,
    unit=" (a fraction of free memory)",
    metavar="F",
    sglang="mem_fraction_static",
    help="fraction of free device memory handed to pool sizing, in (0, 1] (default 0.9)",
)
LAUNCH_ARGS: dict[str, ServerArg] = {
    row.name: row for row in (MODEL_PATH, *SIZING_ARGS, MEM_FRACTION_STATIC) if row.sglang is not None
}
"""The inputs a launch command gives, by the checker's name (``LaunchCommand.values``' keys)."""
