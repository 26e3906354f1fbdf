"""Kimi-K3's release rules: the release must know KimiK3Config; its text_config is checked as
Kimi-Linear's. Its weights are not modelled (``--weights-gib``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from checker.core.errors import ConfigError
from checker.core.releases.config_rules import SRT, Release, where
from checker.core.releases.releases import MODELLED_RELEASES
from checker.families.family import FamilyRules
from checker.families.kimi_linear.rules import check_config as kimi_linear_check_config


def check_config(r: Release, data: Mapping[str, Any]) -> None:
    """A release without KimiK3Config (configs/kimi_k3.py) has no config class registered for the
    model_type (transformers has none either): it cannot load the file at all. From there the text_config
    is a KimiLinearConfig (``KimiLinearConfig(**text_config)``), checked as Kimi-Linear's."""
    if not r.has("kimi_k3.config_class"):
        first = next(v for v in MODELLED_RELEASES if where("kimi_k3.config_class", v) is not None)
        raise ConfigError(
            f"SGLang {r.release} cannot load {r.source}: model_type='kimi_k3' has no config class in this "
            f"release (KimiK3Config, {SRT}configs/kimi_k3.py, arrived in SGLang {first}; transformers' "
            f"AutoConfig refuses the type: ValueError at load); derive for {first} or later"
        )
    text = data.get("text_config")
    if isinstance(text, Mapping):
        kimi_linear_check_config(Release(r.release, r.source, "text_config."), text)


RULES = FamilyRules(check_config=check_config)
