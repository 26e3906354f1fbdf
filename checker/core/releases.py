"""Which SGLang releases the builtin model covers, and the sizing rules of each (torch-free).

Every rule below was read from the released wheels (``pip download --no-deps sglang==X``); the file and
function per release, the diffs between releases and how the groups were found are in
``docs/sglang-releases.md``. A group is a run of consecutive releases whose state-pool sizing, running
request cap, slots per request, startup refusals and budget formula read the same; a release belongs
to exactly one group.

The checker never imports SGLang to learn its version: :func:`installed_sglang_version` reads the
package metadata only.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields

from checker.core.errors import FlagError

# Every release the builtin model covers, oldest first (post releases included: PyPI ships them as
# separate wheels, and a deployment pins one).
MODELLED_RELEASES: tuple[str, ...] = (
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
FIRST_MODELLED = MODELLED_RELEASES[0]
NEWEST_MODELLED = MODELLED_RELEASES[-1]
FIRST_WITH_STATE_POOL = "0.5.2"
"""The first release that sizes a mamba state pool at all (``max_mamba_cache_size``: the user's
--max-running-requests or 512, model_runner.py ``ModelRunner.__init__``). 0.5.2 to 0.5.13.post1 size it
with rules the builtin model does not implement (docs/sglang-releases.md, "Releases not modelled")."""

CHARGING = ("whole-model", "max-share")
BUDGET_RULES = ("slack", "slack+pre-capture", "slack+pre-capture+mm")


@dataclass(frozen=True, kw_only=True)
class ReleaseRules:
    """The rules one group of releases sizes the state pool with. Field docs name what changed."""

    group: str
    """The group's release range, e.g. "0.5.17-0.5.21"."""
    sizing_function: str
    """Where the group's pool sizing lives (file and function, as in the wheel)."""
    charging: str
    """``whole-model``: every stage charged ``mamba_cache_per_req`` for all linear layers (up to 0.5.16);
    ``max-share``: ``int(per_req * max_stage_mamba_layers / total)`` (``pp_layer_scale``, 0.5.17+)."""
    padding_slot: bool
    """0.5.17+: the pool's padding slot is charged: auto-fit K = int((B - per_slot) // per_slot), the
    state charged is (K + 1) slots, the spec reservation covers (capped + 1) requests. Before: K =
    int(B // per_req), K slots charged, capped requests reserved."""
    floor_requests: bool
    """0.5.23: ``max(1, max_running_requests // dp)`` in ``resolve_max_num_reqs``, the no-radix branch
    and the spec-decoding cap. Before: a plain ``//`` that can reach 0 (and then refuses to start)."""
    extra_per_slot: bool
    """0.5.22+: ``extra_mamba_cache_bytes_per_req`` (scaled like per_req) is charged per slot. Before,
    no per-slot extra state exists outside the replay-SSM ring, which the checker does not model."""
    skip_decode_lock: bool
    """0.5.17+: SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK lowers the base slots per request from 3 to 2."""
    lazy_with_spec: bool
    """0.5.17+: extra_buffer_lazy is accepted with speculative decoding; before it is refused at
    startup ("extra_buffer_lazy unsupported with spec.")."""
    budget_rule: str
    """How ``total_rest_memory`` is computed before it reaches the sizing (``checker.core.budget``):
    ``slack`` (0.5.14-0.5.15.post1), ``slack+pre-capture`` (0.5.16-0.5.17: the slack is raised to the
    pre-capture activation reserve when the KV pool is sized after graph capture),
    ``slack+pre-capture+mm`` (0.5.18+: a multimodal runtime reservation is also taken off)."""

    @property
    def policy(self) -> str:
        """The charging policy this release uses (what ``--policy`` defaults to)."""
        return self.charging


_GROUPS: tuple[tuple[tuple[str, ...], ReleaseRules], ...] = (
    (
        ("0.5.14", "0.5.15", "0.5.15.post1"),
        ReleaseRules(
            group="0.5.14-0.5.15.post1",
            sizing_function="sglang/srt/model_executor/model_runner_kv_cache_mixin.py "
            "ModelRunnerKVCacheMixin.handle_max_mamba_cache",
            charging="whole-model",
            padding_slot=False,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=False,
            lazy_with_spec=False,
            budget_rule="slack",
        ),
    ),
    (
        ("0.5.16",),
        ReleaseRules(
            group="0.5.16",
            sizing_function="sglang/srt/mem_cache/kv_cache_configurator.py "
            "KVCacheConfigurator._handle_max_mamba_cache",
            charging="whole-model",
            padding_slot=False,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=False,
            lazy_with_spec=False,
            budget_rule="slack+pre-capture",
        ),
    ),
    (
        ("0.5.17",),
        ReleaseRules(
            group="0.5.17",
            sizing_function="sglang/srt/mem_cache/kv_cache_configurator.py "
            "KVCacheConfigurator._handle_max_mamba_cache",
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture",
        ),
    ),
    (
        ("0.5.18", "0.5.19", "0.5.20", "0.5.21"),
        ReleaseRules(
            group="0.5.18-0.5.21",
            sizing_function="sglang/srt/mem_cache/kv_cache_configurator.py "
            "KVCacheConfigurator._handle_max_mamba_cache",
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=False,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
    (
        ("0.5.22",),
        ReleaseRules(
            group="0.5.22",
            sizing_function="sglang/srt/mem_cache/kv_cache_configurator.py "
            "KVCacheConfigurator._handle_max_mamba_cache",
            charging="max-share",
            padding_slot=True,
            floor_requests=False,
            extra_per_slot=True,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
    (
        ("0.5.23",),
        ReleaseRules(
            group="0.5.23",
            sizing_function="sglang/srt/mem_cache/kv_cache_configurator.py "
            "KVCacheConfigurator._handle_max_mamba_cache",
            charging="max-share",
            padding_slot=True,
            floor_requests=True,
            extra_per_slot=True,
            skip_decode_lock=True,
            lazy_with_spec=True,
            budget_rule="slack+pre-capture+mm",
        ),
    ),
)
_RULES_BY_RELEASE: dict[str, ReleaseRules] = {v: rules for versions, rules in _GROUPS for v in versions}
GROUPS: tuple[ReleaseRules, ...] = tuple(rules for _, rules in _GROUPS)
assert tuple(_RULES_BY_RELEASE) == MODELLED_RELEASES, "every modelled release in exactly one group"


@dataclass(frozen=True, kw_only=True)
class ReleaseModel:
    """The release a derivation follows and that release's rules."""

    version: str
    """The modelled release whose rules apply (the newest modelled one under best effort)."""
    rules: ReleaseRules
    requested: str | None = None
    """The version asked for, when it differs from ``version`` (a newer, unmodelled release)."""
    best_effort: bool = False
    """True when ``requested`` is newer than every modelled release and its newest rules stand in."""

    @property
    def label(self) -> str:
        if self.best_effort:
            return f"SGLang {self.requested} (modelled as {self.version}, the newest modelled release)"
        return f"SGLang {self.version}"


_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?$")


def parse_version(version: str) -> tuple[int, int, int, int]:
    """``"0.5.15.post1"`` -> (0, 5, 15, 1); anything that is not a final release -> FlagError."""
    m = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if m is None:
        raise FlagError(
            f"--sglang-version {version!r} is not a release number like {NEWEST_MODELLED} or 0.5.15.post1; "
            f"modelled releases: {FIRST_MODELLED} to {NEWEST_MODELLED}"
        )
    major, minor, patch, post = m.groups()
    return int(major), int(minor), int(patch), int(post or 0)


def _canonical(version: str) -> str:
    major, minor, patch, post = parse_version(version)
    return f"{major}.{minor}.{patch}" + (f".post{post}" if post else "")


def release_model(version: str | None, *, best_effort: bool = False) -> ReleaseModel:
    """The rules the derivation follows for SGLang ``version`` (None: the newest modelled release).

    A release newer than the newest modelled one is refused (its rules may have changed) unless
    ``best_effort``, which derives with the newest modelled rules and says so. A release older than the
    first modelled one, or one that was never published between them, is refused.
    """
    if version is None:
        return ReleaseModel(version=NEWEST_MODELLED, rules=_RULES_BY_RELEASE[NEWEST_MODELLED])
    canon = _canonical(version)
    if canon in _RULES_BY_RELEASE:
        return ReleaseModel(version=canon, rules=_RULES_BY_RELEASE[canon])
    key = parse_version(canon)
    if key > parse_version(NEWEST_MODELLED):
        if best_effort:
            return ReleaseModel(
                version=NEWEST_MODELLED,
                rules=_RULES_BY_RELEASE[NEWEST_MODELLED],
                requested=canon,
                best_effort=True,
            )
        raise FlagError(
            f"SGLang {canon} is newer than the newest modelled release {NEWEST_MODELLED}: its sizing may "
            f"have changed; pass --sglang-version {NEWEST_MODELLED} or --sglang-best-effort to derive with "
            f"{NEWEST_MODELLED}'s rules"
        )
    if key < parse_version(FIRST_MODELLED):
        pooled = key >= parse_version(FIRST_WITH_STATE_POOL)
        why = (
            "it sizes the state pool with rules the builtin model does not implement "
            "(docs/sglang-releases.md)"
            if pooled
            else "it has no mamba state pool at all"
        )
        raise FlagError(
            f"SGLang {canon} is older than the first modelled release {FIRST_MODELLED}: {why}; "
            f"modelled releases: {FIRST_MODELLED} to {NEWEST_MODELLED}"
        )
    raise FlagError(
        f"SGLang {canon} is not a published release the checker knows; modelled releases: "
        f"{', '.join(MODELLED_RELEASES)}"
    )


def installed_sglang_version(paths: Sequence[str] | None = None) -> str | None:
    """The installed SGLang's version from its package metadata, without importing it (None: not
    installed). ``paths``: where to look instead of ``sys.path`` (another environment's site-packages)."""
    from importlib import metadata

    if paths is None:
        try:
            return metadata.version("sglang")
        except metadata.PackageNotFoundError:
            return None
    for dist in metadata.distributions(path=list(paths)):
        name = dist.metadata["Name"] if dist.metadata else None
        if name is not None and re.sub(r"[-_.]+", "-", name).lower() == "sglang":
            return dist.version
    return None


_EXPLAIN: dict[str, str] = {
    "charging": "{old} charges each stage for the whole model's state; {new} and later charge the largest "
    "stage's share (max_stage_mamba_layers / total), so pools are about P times larger under PP",
    "padding_slot": "{new} and later reserve the pool's padding slot: auto-fit K = (B - per_slot) // "
    "per_slot instead of B // per_req, (K + 1) slots charged, and the spec-decoding reservation covers one "
    "more request",
    "floor_requests": "{new} floors --max-running-requests // dp at 1 (resolver, no-radix pool, spec "
    "reservation); {old} lets it reach 0 and refuses to start",
    "extra_per_slot": "{new} and later charge a per-slot extra state (extra_mamba_cache_bytes_per_req); "
    "{old} has none",
    "skip_decode_lock": "{new} and later read SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK (base 2 slots per request "
    "instead of 3); {old} ignores it",
    "lazy_with_spec": "{new} and later accept extra_buffer_lazy with speculative decoding; {old} refuses it",
    "budget_rule": "{old} and {new} compute the memory handed to sizing differently ({a} vs {b}); the same "
    "device gives different budgets",
}


def explain_release_difference(a: str, b: str, *, only: Collection[str] | None = None) -> list[str]:
    """One line per rule that differs between releases ``a`` and ``b`` (in either order): what can make
    the two derive different values from the same flags. Empty when both are in one group.

    ``only``: the rule names (ReleaseRules fields) that matter for the inputs at hand; see
    :func:`rules_that_matter`."""
    ra, rb = release_model(a), release_model(b)
    old, new = (ra, rb) if parse_version(ra.version) <= parse_version(rb.version) else (rb, ra)
    lines = []
    for f in fields(ReleaseRules):
        if f.name in ("group", "sizing_function") or getattr(old.rules, f.name) == getattr(new.rules, f.name):
            continue
        if only is not None and f.name not in only:
            continue
        # Name the first release with the newer rule: the first of new's rule value after old.
        first_new = next(
            v
            for v in MODELLED_RELEASES
            if parse_version(v) > parse_version(old.version)
            and getattr(_RULES_BY_RELEASE[v], f.name) == getattr(new.rules, f.name)
        )
        lines.append(
            _EXPLAIN[f.name].format(
                old=old.version, new=first_new, a=getattr(old.rules, f.name), b=getattr(new.rules, f.name)
            )
        )
    if old.rules.sizing_function != new.rules.sizing_function and not lines:
        lines.append(f"{old.version} and {new.version} size the pool in different files with the same rules")
    return lines
