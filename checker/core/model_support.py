"""Can this SGLang release load this model at all? Each release's own model registry decides (torch-free).

SGLang picks the model class from the config's ``architectures`` (``model_loader/utils.py``
``get_model_architecture``) in its registry (``models/registry.py``): the classes the modules of
``sglang/srt/models`` list as ``EntryClass``. :mod:`checker.core.model_registry` holds, per architecture,
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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from checker.core.errors import FlagError
from checker.core.model_registry import EXTERNAL_PACKAGE, REGISTERED
from checker.core.models import DEFAULT_MODEL, read_json
from checker.core.releases import MODELLED_RELEASES

EXTERNAL_PACKAGE_ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"
PRESET_ARCHITECTURES: dict[str, tuple[str, ...]] = {"kimi-k3": ("KimiK3ForConditionalGeneration",)}
"""The architecture a preset stands for: kimi-k3 is the upstream unit test's Kimi-K3 shape
(``model_type`` kimi_k3, ``configs/kimi_k3.py`` KimiK3Config, ``models/kimi_k3.py``)."""


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


def model_architectures(*, model: str | None, model_config: str | None) -> tuple[str, ...]:
    """The architectures SGLang would look up for the model as the user named it: a preset's, an HF
    config's ``architectures`` list; none for a JSON model spec (it names none)."""
    if model_config is None:  # no model named: the default preset, which load_geometry derives
        return PRESET_ARCHITECTURES.get(model or DEFAULT_MODEL, ())
    data = read_json(model_config)
    archs = data.get("architectures")
    if "linear_layer_ids" in data or not isinstance(archs, list):
        return ()
    return tuple(a for a in archs if isinstance(a, str))
