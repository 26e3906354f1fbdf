"""Can this SGLang release load this model at all? Each release's own model registry decides (torch-free).

SGLang picks the model class from the config's ``architectures`` (``model_loader/utils.py``
``get_model_architecture``) in its registry (``models/registry.py``): the classes the modules of
``sglang/srt/models`` list as ``EntryClass``. :mod:`checker.core.releases.model_registry` holds, per
architecture,
the modelled releases that register it (built from the wheels by ``scripts/build_model_support.py``).

What the registry does with an architecture it has no class for: it appends ``TransformersForCausalLM``
(the Transformers backend, every modelled release). That backend runs the model's Transformers code
through SGLang's attention; it has no SGLang linear-attention layers, so it never sizes or uses the
mamba state pool this checker is about: a hybrid model there is not the deployment being checked, and
a node on such a release cannot serve it as one. So a release that does not register any of the
model's architectures is an error naming the release where the architecture arrived. Two ways the
checker cannot see through: an external model package (SGLANG_EXTERNAL_MODEL_PACKAGE, 0.5.6+)
registers classes of the user's, so the check is skipped when it is set; and a JSON model spec names no
architecture, so it is not checked.

Under pipeline parallelism the class the registry picks must also start on every stage: its constructor
must not assert a single stage, its ``forward`` must take ``pp_proxy_tensors`` (the model runner's
``support_pp``), each stage must build and run only its own layers, and its ``load_weights`` must skip
what another stage holds. :mod:`checker.core.releases.pp_support` (built from each release's code by
``scripts/build_pp_support.py``) says, per class and release, which of these stops it and where;
:func:`check_pipeline` turns that into the refusal, with a way out that starts. A JSON model spec names no
class: ``ReleaseRules.pp_hybrid`` (:func:`any_class_runs_under_pp`, the same table) refuses pp > 1 only
on the releases where no hybrid class the checker reads runs under PP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from checker.core.errors import FlagError
from checker.core.releases.model_registry import EXTERNAL_PACKAGE, REGISTERED
from checker.core.releases.pp_support import MODEL_RUNNER_ASSERT, PIPELINE
from checker.core.releases.releases import MODELLED_RELEASES
from checker.core.sizing.models import read_json

EXTERNAL_PACKAGE_ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"


def _index(release: str) -> int:
    return MODELLED_RELEASES.index(release)


def registers(release: str, architecture: str) -> bool:
    """Whether modelled ``release``'s registry has a class for ``architecture``."""
    i = _index(release)
    return any(_index(a) <= i <= _index(b) for a, b in REGISTERED.get(architecture, ()))


def _in(spans: Sequence[tuple[str, str]], release: str) -> bool:
    i = _index(release)
    return any(_index(a) <= i <= _index(b) for a, b in spans)


def arrived_in(architecture: str) -> str | None:
    """The first modelled release whose registry has ``architecture`` (None: none of them)."""
    spans = REGISTERED.get(architecture)
    return spans[0][0] if spans else None


def check_architectures(
    release: str, architectures: Sequence[str], *, model: str, env: Mapping[str, str | None]
) -> None:
    """FlagError unless modelled ``release`` registers one of ``architectures`` (the config's list: the
    registry takes the first it has). ``model``: how the user named the model (for the message)."""
    archs = [a for a in architectures if isinstance(a, str) and a]
    if not archs or release not in MODELLED_RELEASES:
        return  # nothing to look up (a JSON model spec), or a release the table does not cover
    if env.get(EXTERNAL_PACKAGE_ENV) and _in(EXTERNAL_PACKAGE, release):
        return  # the user's own package may register it: the release's registry is not all there is
    if any(registers(release, a) for a in archs):
        return
    arch = archs[0]
    first = arrived_in(arch)
    way_out = "upgrade it"
    if first is not None and _index(first) > _index(release):
        when = f"it arrived in SGLang {first}"
    elif first is not None:
        # Registered once and dropped since (VILA: 0.5.2 to 0.5.4): an upgrade does not bring it back.
        last = REGISTERED[arch][-1][1]
        when = f"SGLang {first} to {last} register it"
        way_out = "run a release that registers it"
    else:
        when = f"no release from {MODELLED_RELEASES[0]} to {MODELLED_RELEASES[-1]} registers it"
    raise FlagError(
        f"SGLang {release} cannot load {model}: its model registry (sglang/srt/models) has no class for "
        f"{arch}; {when}. It would fall back to the Transformers backend, which has no linear-attention "
        f"state pool to size, so this node cannot serve the model as the deployment does: {way_out}"
    )


def config_architectures(model_config: str) -> tuple[str, ...]:
    """The architectures SGLang would look up for an HF config (its ``architectures`` list); none for a
    JSON model spec (it names none). A preset's are its family's
    (:func:`checker.families.geometry.model_architectures`)."""
    data = read_json(model_config)
    archs = data.get("architectures")
    if "linear_layer_ids" in data or not isinstance(archs, list):
        return ()
    return tuple(a for a in archs if isinstance(a, str))


# ------------------------------------------------------------------------------------------------------
# Pipeline parallelism: does the release's class start on every stage?
# ------------------------------------------------------------------------------------------------------

STARTS = "stages"
"""The :data:`PIPELINE` status of a class whose every stage builds and runs its own layers."""


def registry_choice(release: str, architectures: Sequence[str]) -> str | None:
    """The architecture modelled ``release``'s registry resolves the config's list to: the first it has
    (``models/registry.py`` ``resolve_model_cls``); None: none (check_architectures refuses that)."""
    return next((a for a in architectures if isinstance(a, str) and registers(release, a)), None)


def pipeline_status(release: str, architecture: str) -> tuple[str, str, str] | None:
    """(status, where, also) of ``architecture`` on modelled ``release``
    (:mod:`checker.core.releases.pp_support`);
    None: a class the table does not cover, or a release that does not register it."""
    return PIPELINE.get(architecture, {}).get(release)


def runs_under_pp(release: str, architecture: str) -> bool | None:
    """Whether ``release`` starts ``architecture`` at pp > 1 (None: the table does not cover it)."""
    entry = pipeline_status(release, architecture)
    return None if entry is None else entry[0] == STARTS


def builds_all_layers(release: str, architecture: str) -> bool:
    """Whether, at pp > 1, every stage of ``release`` would build every layer of ``architecture`` (the
    whole model's weights on each stage: Qwen3.5 on 0.5.9, Nemotron-H 0.5.3.post1-0.5.7). Such a
    deployment is refused (:func:`check_pipeline`): each stage also runs every layer."""
    entry = pipeline_status(release, architecture)
    return entry is not None and entry[0] == "all-layers"


def any_class_runs_under_pp(release: str) -> bool:
    """Whether any hybrid class the checker reads starts at pp > 1 on ``release`` (what a JSON model
    spec, which names no class, is checked against: ``ReleaseRules.pp_hybrid``)."""
    return any(by_release.get(release, ("",))[0] == STARTS for by_release in PIPELINE.values())


def first_release_under_pp(architecture: str, after: str) -> str | None:
    """The first modelled release after ``after`` that starts ``architecture`` under PP."""
    later = MODELLED_RELEASES[_index(after) + 1 :]
    return next((v for v in later if runs_under_pp(v, architecture)), None)


def _why(status: str, where: str, also: str, runner: str | None) -> str:
    """What stops the class, with the SGLang file:line (``also``: a second line of the same file;
    ``runner``: where the release's model runner asserts ``support_pp``, None where it does not)."""
    at = f"sglang/srt/{where}"
    line = f":{also.rsplit(':', 1)[-1]}" if also else ""
    if status == "single-stage":
        return f"its constructor asserts a single pipeline stage ({at})"
    if status == "no-pp":
        if runner:
            return (
                f"its forward takes no pp_proxy_tensors ({at}), which the model runner asserts under PP "
                f"(sglang/srt/{runner})"
            )
        return f"its forward takes no pp_proxy_tensors ({at}): a later stage never gets the activations"
    if status == "all-layers":
        runs = f" and runs them all ({line})" if also else ""
        return f"every stage builds every layer ({at}){runs}: the stages do not split the model"
    if status == "unfiltered-load":
        tie = (
            f"; with tie_word_embeddings the later stages fail first, in the constructor ({line})"
            if also
            else ""
        )
        return f"its load_weights has no stage filter ({at}: KeyError on another stage's layers){tie}"
    return f"{status} ({at})"


def pipeline_refusal(
    release: str,
    arch: str,
    entry: tuple[str, str, str],
    *,
    runner: str | None,
    pp_size: int,
    tp_group_size: int,
    tp_fits: Callable[[int], bool] | None = None,
    later: str | None = None,
) -> FlagError:
    """The one line for a class ``release`` does not start at ``pp_size`` stages: ``entry`` (status,
    where, also) as :mod:`checker.core.releases.pp_support` or the installed code says, ``runner`` the model
    runner's assert, ``later`` the first release that starts it; the way out names the same GPUs as
    tensor parallelism where the model shards over them (``tp_fits``)."""
    status, where, also = entry
    gpus = pp_size * tp_group_size
    if tp_fits is None or tp_fits(gpus):
        outs = [f"--pp-size 1 --tp-size {gpus} (the same GPUs as tensor parallelism)"]
    else:
        outs = [f"--pp-size 1 (it does not shard over --tp-size {gpus})"]
    if later is not None:
        outs.append(f"SGLang {later} (the first release that starts it under PP)")
    return FlagError(
        f"SGLang {release} cannot start {arch} at --pp-size {pp_size}: {_why(status, where, also, runner)}; "
        f"use {' or '.join(outs)}"
    )


def check_pipeline(
    release: str,
    architectures: Sequence[str],
    *,
    pp_size: int,
    tp_group_size: int,
    env: Mapping[str, str | None],
    tp_fits: Callable[[int], bool] | None = None,
) -> None:
    """FlagError unless modelled ``release`` starts the class it picks from ``architectures`` at
    ``pp_size`` stages. ``tp_group_size``: the GPUs of one stage (SGLang's --tp-size); ``tp_fits(n)``:
    whether the model shards over a TP group of ``n`` (the way out offers the same GPUs as TP only then).

    The message names the class, the release, the SGLang file:line that stops it, and a way out that
    starts: the same GPUs as tensor parallelism, and the first release whose class runs under PP."""
    if pp_size <= 1 or release not in MODELLED_RELEASES:
        return
    if env.get(EXTERNAL_PACKAGE_ENV) and _in(EXTERNAL_PACKAGE, release):
        return  # the user's own package may register its own class for the architecture
    arch = registry_choice(release, architectures)
    entry = pipeline_status(release, arch) if arch is not None else None
    if arch is None or entry is None or entry[0] == STARTS:
        return
    raise pipeline_refusal(
        release,
        arch,
        entry,
        runner=MODEL_RUNNER_ASSERT.get(release),
        pp_size=pp_size,
        tp_group_size=tp_group_size,
        tp_fits=tp_fits,
        later=first_release_under_pp(arch, release),
    )
