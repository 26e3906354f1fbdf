"""The deployment's launch command and the checker's own flags: one set of sizing inputs (torch-free).

``checker [OPTIONS] -- python -m sglang.launch_server ARGS``: the sizing inputs come from the launch
command as the release parses it (:mod:`checker.launch.command`). A sizing input given in both places
must agree, or the run stops with one line naming both; a translation that silently checks something
other than what runs is the drift this tool exists to catch.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from checker.core.errors import FlagError, printable
from checker.core.releases.startup import refuse, resolve_speculative, zero_micro_batch_refused
from checker.core.sizing.environ import PP_SPEC_ENV
from checker.core.sizing.server_args import LAUNCH_ARGS, SIZING_FLAG_NAMES

MICRO_BATCH_POSITIVE = "pp-max-micro-batch-size-must-be-a-positive-1079cf"
"""0.5.11+ ``check_server_args``: ``pp_max_micro_batch_size is None or >= 1``
(checker.core.releases.arg_checks)."""

if TYPE_CHECKING:  # the flag tables load only when a launch command is parsed
    from checker.core.releases.launch_checks import LaunchFacts
    from checker.launch.command import LaunchCommand

# The launch command's inputs by the checker's name (LaunchCommand.values' keys): the rows of the table of
# sizing inputs with an SGLang spelling, plus the model and --mem-fraction-static.
CHECKER_FLAG = {name: row.flag for name, row in LAUNCH_ARGS.items()}
# How the launch command spells an input where its flag differs from the checker's (for the messages).
SGLANG_FLAG = {name: row.sglang_flag for name, row in LAUNCH_ARGS.items() if row.sglang_flag != row.flag}


@dataclass(frozen=True, kw_only=True)
class LaunchInputs:
    """What the report records of the launch command: how it was read and its sizing inputs."""

    parser: str
    release: str
    text: str
    """The explicit sizing inputs no other input carries, canonical (``k=v`` sorted): digested across
    ranks."""
    sizing: str = ""
    """Every explicit sizing input, canonical (``k=v`` sorted, the model last): what a single-process
    command (derive, plan) reports, as nothing is compared there."""
    argv: tuple[str, ...] = ()
    """The whole launch command as given (the words after ``--``): the report keeps it."""
    form: str = ""
    explicit: frozenset[str] = frozenset()
    """The inputs (by the checker's name) the command gives: the rest of ``values`` are the release
    parser's defaults, which a rank derives with but never reports as given."""
    attention: str | None = None
    """The TP and attention-DP flags as the command gives them (``--tp-size 2 --enable-dp-attention
    --dp-size 2``), None where it gives none: the ``attention_layout`` input."""
    weights: dict[str, object] = dataclasses.field(default_factory=dict)
    """The flags that decide a rank's weights beyond the sizing inputs (``LaunchCommand.weights``)."""
    download_dir: str | None = None
    """``--download-dir``: where SGLang's loader keeps a hub model's weights."""
    revision: str | None = None
    """``--revision``: the hub revision whose snapshot under ``download_dir`` holds the weights."""

    @property
    def input(self) -> str:
        """The ``launch_command`` input every rank sends: how the server is started and the sizing inputs
        only the launch command gives (the others are compared as inputs of their own). Which parser read
        it is left out: it follows from the installed release and --sglang-version, compared apart."""
        return f"{self.started}: {self.text}" if self.text else self.started

    @property
    def started(self) -> str:
        return self.form.removesuffix(" ARGS") if self.form.endswith(" ARGS") else "server args"

    @property
    def described(self) -> str:
        """The whole reading, for derive and plan: every explicit sizing input, then the parser."""
        return f"{self.started}: {self.sizing} (read by {self.parser})"


def split_launch_command(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """``[checker args] -- [launch command]`` -> the two halves (None: no ``--``)."""
    words = list(argv)
    if "--" not in words:
        return words, None
    i = words.index("--")
    return words[:i], words[i + 1 :]


def _config_file(path: object) -> str:
    # start-up: the hub cache rules load only for a --model-config; a hub id: the same rule
    from checker.core.weights.hub_cache import local_model_path

    p = local_model_path(str(path), flag="--model-config")
    return os.path.realpath(os.path.join(p, "config.json") if os.path.isdir(p) else p)


def _same(a: object, b: object, key: str = "") -> bool:
    """Whether the checker's value and the launch command's are one input: the same config.json, or the
    same number. Exactly the same: both sides are read from text by float()/int(), so "0.9" and "0.90"
    agree, and any other difference is a difference in what the server runs."""
    if key == "model_config":
        return _config_file(a) == _config_file(b)
    if isinstance(a, float) or isinstance(b, float):
        try:
            return float(a) == float(b)  # type: ignore[arg-type]  # any object: a TypeError is caught
        except (TypeError, ValueError):
            return False
    return a == b


@dataclass(frozen=True, kw_only=True)
class LaunchMerge:
    """The checker's flags and the launch command merged: what the launch command sets and what the report
    records of it. The flags are left as they were (the CLI layer applies ``values``)."""

    values: Mapping[str, object]
    """The launch command's sizing inputs the checker's own flags did not give, by the flags' dests (read
    only): the checker's flags with these in place are the command's inputs."""
    launch: LaunchInputs

    def applied(self, flags: Mapping[str, object]) -> dict[str, object]:
        """``flags`` (a copy) with the launch command's values in place."""
        return {**flags, **self.values}


def merge_launch(
    flags: Mapping[str, object],
    launch: Sequence[str],
    *,
    given: frozenset[str],
    env: Mapping[str, str],
    installed: str | None,
) -> LaunchMerge:
    """The checker's parsed flags (by dest; ``given``: the dests typed) and the deployment's launch
    command as one set of sizing inputs: the launch command's fill the flags it gives, and one given in
    both places must agree. ``env``: the rank's environment (the launch command's start-up checks read
    SGLANG_ENABLE_PP_SPEC); ``installed``: the installed SGLang's version (its own parser reads the
    command where it is the release asked for). Neither input is changed."""
    if not launch:
        raise FlagError(
            "nothing after --: give the deployment's launch command, e.g. -- python -m "
            "sglang.launch_server --model-path /models/M --pp-size 8 ..."
        )
    release = flags.get("sglang_version")
    assert release is None or isinstance(release, str)  # --sglang-version: a string flag
    if release and "," in release:
        raise FlagError("--sglang-version A,B compares releases; with a launch command give one release")
    # start-up: the launch parser and its flag tables load only for a launch command
    from checker.launch.command import parse_launch_command

    cmd = parse_launch_command(
        launch, release=release, prefer_installed=release is None or release == installed
    )
    _refuse_unread_config(cmd, launch)
    values = _checked_values(cmd)
    fills: dict[str, object] = {}
    for key, value in values.items():
        if key not in flags:
            continue  # an input this command does not use (e.g. --mem-fraction-static for derive)
        if key == "model_config" and flags.get("model"):
            raise FlagError(
                f"--model {flags['model']} and --model-path {value} in the launch command name two models; "
                "drop --model"
            )
        if key in given:
            ours = flags[key]
            if not _same(ours, value, key):
                theirs = SGLANG_FLAG.get(key, CHECKER_FLAG[key])
                if not _explicit(cmd, key):  # the release's default, which nobody typed
                    raise FlagError(
                        f"{CHECKER_FLAG[key]} {ours} disagrees with the launch command, which does not give "
                        f"{theirs} (SGLang {cmd.release} then uses {value}); give it in the launch command "
                        "(the launch command is what the server runs)"
                    )
                raise FlagError(
                    f"{CHECKER_FLAG[key]} {ours} and {theirs} {value} in the launch command disagree; give "
                    "it in one place (the launch command is what the server runs)"
                )
            continue
        fills[key] = value
    merged = {**flags, **fills}
    _refuse_draft_tokens_alone(cmd, merged)
    # start-up: the launch command's own start-up checks load with the launch parser
    from checker.core.releases.launch_checks import check_launch

    check_launch(launch_facts(cmd, merged, env))
    refuse_unmodelled(cmd)
    compared = _compared_apart(merged)
    items = sorted(cmd.sizing_text().items(), key=lambda kv: (kv[0] == "model_config", kv[0]))
    given_items = [(k, v) for k, v in items if _explicit(cmd, k)]
    inputs = LaunchInputs(
        parser=cmd.parser,
        release=cmd.release,
        text=" ".join(f"{k}={v}" for k, v in given_items if k not in compared),
        sizing=" ".join(f"{k}={v}" for k, v in given_items),
        argv=tuple(launch),
        form=cmd.form,
        explicit=frozenset(k for k in values if _explicit(cmd, k)),
        attention=typed_attention(cmd),
        weights=dict(cmd.weights),
        download_dir=cmd.location.get("download_dir"),
        revision=cmd.location.get("revision"),
    )
    return LaunchMerge(values=MappingProxyType(fills), launch=inputs)


# The attention-layout fields as a launch command spells them, in the order a reader says them:
# `--tp-size 2 --enable-dp-attention --dp-size 2` (up to 0.5.21), `--tp-size 2 --attn-dp-size 2` (0.5.22+).
_ATTENTION_SPELLING = (
    ("tp_size", "--tp-size"),
    ("enable_dp_attention", "--enable-dp-attention"),
    ("dp_size", "--dp-size"),
    ("attn_dp_size", "--attn-dp-size"),
    ("attn_cp_size", "--attn-cp-size"),
)


def typed_attention(cmd: LaunchCommand) -> str | None:
    """The TP and attention-DP flags the launch command gives, as it gives them (its canonical spelling of
    each; a flag is only named when typed, never at its parser default). None: it gives none.

    --dp-size without attention DP makes independent replicas whose pools are sized alone (nothing a rank
    derives changes), so it is named only beside --enable-dp-attention or --attn-dp-size."""
    typed = cmd.sglang_explicit
    values = cmd.sglang_values
    attention_dp = bool(values.get("enable_dp_attention")) or "attn_dp_size" in typed
    words = []
    for field, flag in _ATTENTION_SPELLING:
        if field not in typed or (field == "dp_size" and not attention_dp):
            continue
        value = values.get(field)
        if isinstance(value, bool):
            if value:
                words.append(flag)
        else:
            words.append(f"{flag} {value}")
    return " ".join(words) or None


@dataclass(frozen=True, kw_only=True)
class GivenFlags:
    """What the user typed, of a command's sizing inputs: the checker's own flags and the launch
    command's, never a default (the checker's or a release parser's)."""

    names: frozenset[str]
    """The sizing inputs given, by the checker's name (SizingFlags fields)."""
    attention: str | None
    """The TP and attention-DP flags as typed (the ``attention_layout`` input): the launch command's
    where there is one, else the checker's own --tp-size and --dp-size."""


def given_flags(args: argparse.Namespace) -> GivenFlags | None:
    """The sizing inputs ``args`` were given (``args.given``: the checker flags' dests typed, set by the
    entry point; ``args.launch``: the launch command read), or None where the entry point did not record
    them (a config built by hand: every value counts as given)."""
    ours = getattr(args, "given", None)
    if ours is None:
        return None
    launch: LaunchInputs | None = getattr(args, "launch", None)
    names = set(ours) | (set(launch.explicit) if launch is not None else set())
    if launch is not None:
        attention = launch.attention
    else:
        typed = [name for name in ("tp_size", "dp_size") if name in ours]
        attention = " ".join(f"--{name.replace('_', '-')} {getattr(args, name)}" for name in typed)
    return GivenFlags(names=frozenset(names), attention=attention or None)


# The raw SGLang fields the checker's tp_size and dp_size (the attention layout a rank derives with) are
# computed from (command._attention): a change to one shows as the attention TP and DP sizes it gives.
# --dp-size without attention DP makes independent replicas, each sized with attention DP 1: nothing a
# rank derives changes with it.
_ATTENTION_FIELDS = tuple(
    f"sglang.{name}" for name in ("tp_size", "dp_size", "enable_dp_attention", "attn_dp_size", "attn_cp_size")
)


def _compared_apart(flags: Mapping[str, object]) -> set[str]:
    """The launch command's inputs that ranks compare as inputs of their own, left out of the
    ``launch_command`` input so that one flag changed on some nodes is named once, as itself: every
    sizing flag, the model (``model``, by its config's content), the TP layout, and
    --mem-fraction-static where it makes the budget (``budget_source`` under --budget-from-device)."""

    out = {*SIZING_FLAG_NAMES, "model_config", *_ATTENTION_FIELDS}
    if flags.get("budget_from_device", False):
        out.add("mem_fraction_static")
    return out


def _refuse_draft_tokens_alone(cmd: LaunchCommand, flags: Mapping[str, object]) -> None:
    """``--speculative-num-draft-tokens`` in the launch command with no algorithm anywhere: SGLang runs
    no speculative decoding then (the pool sizing asks ``spec_algorithm.is_none()``; 0.5.3.post2-0.5.6.post2
    still scale the pool by the draft tokens), while the checker's own flag alone means speculative
    decoding. Which one is meant is the user's to say, not the checker's to guess."""
    if "speculative_num_draft_tokens" not in cmd.explicit or flags.get("speculative_algorithm"):
        return
    d = cmd.values.get("speculative_num_draft_tokens")
    raise FlagError(
        f"--speculative-num-draft-tokens {d} in the launch command without --speculative-algorithm: SGLang "
        f"{cmd.release} runs no speculative decoding then; add --speculative-algorithm (e.g. EAGLE) to the "
        "launch command, or drop the draft tokens"
    )


def _given(cmd: LaunchCommand, name: str, kind: type, default: object) -> object:
    """A flag the launch command gives (``LaunchCommand.given_values``), typed as SGLang types it: the
    table parser keeps a flag sizing does not read as its text, a switch as True."""
    value = cmd.given_values.get(name, default)
    if value is None or isinstance(value, bool) or kind is str:
        return value
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            flag = "--" + name.replace("_", "-")
            raise FlagError(
                f"launch command {flag} {printable(value)}: not an {kind.__name__}, as SGLang {cmd.release} "
                "reads it"
            ) from None
    return value


def launch_facts(cmd: LaunchCommand, flags: Mapping[str, object], env: Mapping[str, str]) -> LaunchFacts:
    """What the launch command gives the release's start-up checks
    (:func:`checker.core.releases.launch_checks.check_launch`).
    The pp size is the one the deployment runs: the launch command's (SGLang's default 1), or the
    checker's; the speculative setup is the merged one (the launch command's, or the checker's own flags)."""
    # start-up: the sizing rules load with the derivation anyway; not before a launch command is read
    from checker.core.releases.launch_checks import LaunchFacts
    from checker.core.sizing.sizing import env_flag

    sv = cmd.sglang_values
    launch_pp = cmd.values.get("pp_size")  # an int: every release's parser types --pp-size int
    pp = _flag(flags, "pp_size", None) or (launch_pp if isinstance(launch_pp, int) else None) or 1
    algorithm = _flag(flags, "speculative_algorithm", None)
    draft = _flag(flags, "speculative_num_draft_tokens", None)
    try:
        resolved = resolve_speculative(
            cmd.release,
            algorithm=algorithm,
            steps=_flag(flags, "speculative_num_steps", None),
            topk=_flag(flags, "speculative_eagle_topk", None),
            draft_tokens=draft,
            max_running_requests=_flag(flags, "max_running_requests", None),
        ).draft_tokens
    except FlagError:  # refused with the sizing inputs, in its own words (preflight.resolve.capacity_inputs)
        resolved = None
    switch = bool
    return LaunchFacts(
        release=cmd.release,
        pp_size=_int_or(pp, 1),
        tp_size=_int_or(sv.get("tp_size"), 1),
        dp_size=_int_or(sv.get("dp_size"), 1),
        nnodes=_int_or(_given(cmd, "nnodes", int, 1), 1),
        enable_dp_attention=bool(sv.get("enable_dp_attention")),
        attn_dp_size=_int_or(sv.get("attn_dp_size"), 1),
        speculative_algorithm=algorithm,
        speculative=bool(algorithm) or bool(draft),
        draft_tokens=resolved,
        speculative_eagle_topk=_flag(flags, "speculative_eagle_topk", None),
        enable_multi_layer_eagle=switch(_given(cmd, "enable_multi_layer_eagle", bool, False)),
        speculative_adaptive=switch(_given(cmd, "speculative_adaptive", bool, False)),
        disaggregation_mode=str(_given(cmd, "disaggregation_mode", str, "null")),
        min_free_slots_delay=_given(cmd, "min_free_slots_delay", int, None),
        pp_spec_env=env_flag(env.get(PP_SPEC_ENV)),
        chunked_prefill_size=_optional_int(sv.get("chunked_prefill_size")),
        page_size=_backend_page(cmd.release, _flag(flags, "page_size", None), flags),
        disable_radix_cache=bool(_flag(flags, "disable_radix_cache", False)),
        disable_overlap_schedule=bool(_flag(flags, "disable_overlap_schedule", False)),
        mamba_radix_cache_strategy=str(_flag(flags, "mamba_radix_cache_strategy", None) or "auto"),
        enable_mixed_chunk=bool(sv.get("enable_mixed_chunk")) and "enable_mixed_chunk" in cmd.sglang_explicit,
        enable_dp_lm_head=switch(_given(cmd, "enable_dp_lm_head", bool, False)),
        ep_join_mode=_given(cmd, "ep_join_mode", str, None),  # type: ignore[arg-type]
        enable_linear_replayssm=switch(_given(cmd, "enable_linear_replayssm", bool, False)),
        enable_linear_replayssm_spec=bool(_flag(flags, "enable_linear_replayssm_spec", False)),
        linear_replayssm_cache_len=_flag(flags, "linear_replayssm_cache_len", None),
        mamba_ssm_dtype=_flag(flags, "mamba_ssm_dtype", None),
    )


def _backend_page(release: str, page: int | None, flags: Mapping[str, object]) -> int | None:
    """The page size the release's later checks read (``check_server_args``' chunked-prefill divisibility):
    the typed one after the attention backends' rules (checker.core.sizing.page_size)."""
    # start-up: the page rules load with the derivation anyway; not before a launch command is read
    from checker.core.sizing.page_size import FLAG_OF, resolve_page_size

    backends = {n: flags.get(n) for n in FLAG_OF.values()}
    if not any(backends.values()):
        return page
    resolved = resolve_page_size(release, page or 1, backends)  # type: ignore[arg-type]
    return resolved.page_size if resolved.changed_by else page


def _flag(flags: Mapping[str, object], name: str, default: Any) -> Any:
    """A flag's value as its parser typed it (``default`` where the command has no such flag)."""
    return flags.get(name, default)


def refuse_unmodelled(cmd: LaunchCommand) -> None:
    """A server argument the release's pool sizing reads that nothing in the checker models
    (:data:`checker.core.releases.arg_policy.REFUSED_SIZING_READS`), given with a value other than the
    release's
    default: refused in one line naming where the release reads it, never parsed and ignored."""
    # start-up: the policy loads with the launch parser, only for a launch command
    from checker.core.releases.arg_policy import REFUSED_SIZING_READS, SIZING_READS

    given = [name for name in REFUSED_SIZING_READS if name in cmd.given_values]
    if not given:
        return
    # start-up: the generated table loads only when such a flag is given
    from checker.core.releases.arg_quote import sizing_default, sizing_read_site

    for name in given:
        value = cmd.given_values[name]
        site = sizing_read_site(name, cmd.release)
        if site is None or _is_default(value, sizing_default(name)):
            continue
        flag = "--" + name.replace("_", "-")
        shown = "" if value is True else f" {printable(str(value))}"
        raise FlagError(
            f"launch command {flag}{shown}: SGLang {cmd.release}'s pool sizing reads it ({site}), and "
            f"{SIZING_READS[name].why}: the checker cannot check this deployment's values; drop {flag} "
            "if the server does not need it"
        )


def _is_default(value: object, default: str | None) -> bool:
    """Whether a launch command's value is the release's default (``default``: its Python source)."""
    if default is None:
        return False
    try:
        expected = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return False
    if isinstance(value, str) and not isinstance(expected, str) and expected is not None:
        try:
            value = type(expected)(value)
        except (TypeError, ValueError):
            return False
    return bool(value == expected) and type(value) is type(expected)


def _int_or(value: object, default: int) -> int:
    """An int the parser typed (never a bool), else ``default`` (unset)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _zero_micro_batch_refused(release: str) -> bool:
    try:
        return zero_micro_batch_refused(release)
    except FlagError:  # an installed pre-release or local build: as the releases after 0.5.11 do
        return True


def _checked_values(cmd: LaunchCommand) -> dict[str, object]:
    """The launch command's inputs, each checked by its row of the table as the checker's own flag is
    (exit 2 naming the launch command's flag) and read as SGLang reads it (0 is unset where SGLang says
    so). What the command typed is checked too where the checker's value is derived from it: --tp-size 4
    with attention DP 2 is an attention TP of 2, and --tp-size 0 is no TP size at all."""
    out: dict[str, object] = {}
    for key, value in cmd.values.items():
        row = LAUNCH_ARGS.get(key)
        if row is None:
            continue
        typed = None if row.sglang is None else cmd.sglang_values.get(row.sglang)
        if (
            key == "pp_max_micro_batch_size"
            and typed == 0
            and row.sglang in cmd.sglang_explicit
            and _zero_micro_batch_refused(cmd.release)
        ):
            refuse(
                MICRO_BATCH_POSITIVE,
                cmd.release,
                gave="launch command --pp-max-micro-batch-size 0",
                way_out="leave it out for max_running_requests // pp_size, or give a positive cap",
                pp_max_micro_batch_size=0,
            )
        if typed is not None and row.sglang in cmd.sglang_explicit:
            row.launch_value(typed)
        out[key] = row.launch_value(value)
    return out


def _refuse_unread_config(cmd: LaunchCommand, launch: Sequence[str]) -> None:
    """SGLang reads a config file only for the exact word ``--config`` (server_args.py
    ``prepare_server_args``: ``if "--config" in argv``, in every release that has the flag); argparse
    still accepts ``--conf FILE`` or ``--config=FILE`` and stores a path nothing reads. The server would
    start without the file, so the check would check something other than what the user meant."""
    if "config" not in cmd.sglang_explicit:
        return
    path = cmd.sglang_values.get("config")
    spelling = next(
        (w.split("=", 1)[0] for w in launch if w.startswith("--") and "--config".startswith(w.split("=")[0])),
        "--config",
    )
    raise FlagError(
        f"{spelling} {path} in the launch command: SGLang {cmd.release} reads a config file only when it "
        f"is spelled exactly `--config {path}` (as its own word, not abbreviated, not with =); as given, "
        "the server would start without it"
    )


def _explicit(cmd: LaunchCommand, key: str) -> bool:
    """Whether the command gave ``key`` (a LaunchCommand's checker name, or ``sglang.X``)."""
    if key.startswith("sglang."):
        return key.removeprefix("sglang.") in cmd.sglang_explicit
    return key in cmd.explicit


def launch_text(args: argparse.Namespace, *, compared: bool = True) -> str | None:
    """The ``launch_command`` input: as ranks compare it (``compared``: the flags no other input
    carries), or as a single process reports it (every explicit sizing flag and the parser)."""
    launch: LaunchInputs | None = getattr(args, "launch", None)
    if launch is None:
        return None
    return launch.input if compared else launch.described
