"""What each SGLang release refuses in a ``config.json`` of the families the checker reads (torch-free).

SGLang loads a model's config through its own config class (``configs/<family>.py``, registered over
transformers' by ``hf_transformers_utils.get_config``), then builds the model class from it. Each class
checks some fields in its constructor and reads others later; a config it refuses stops the server at
start-up, so a ``consistent`` verdict for it would promise a deployment that never runs. The checks
differ between releases (Nemotron-H's layer pattern is a regular expression up to 0.5.9 and a set of
characters from 0.5.10, where ``layers_block_type`` also became the field read first), so each rule
here is applied on the releases whose code has it, with the ``file:line`` that release has it at
(:mod:`checker.core.releases.config_lines`, generated from every release's code by
``scripts/build_config_rules.py``). A refusal is one line naming the release, the field as written, why
the release refuses it and where.

Applied where the release derived as is modelled (``release.modelled == release.derived_as``); the
geometry reader (:mod:`checker.core.sizing.models`) refuses what no release loads, whatever the release.
"""

from __future__ import annotations

from checker.core.errors import ConfigError, shorten
from checker.core.releases.config_lines import WHERE
from checker.core.releases.releases import MODELLED_RELEASES

SRT = "sglang/srt/"
FIX = "fix it in the model config"


def where(rule: str, release: str) -> str | None:
    """``file:line`` of ``rule`` in ``release``'s code, None where the release has no such check."""
    if release not in MODELLED_RELEASES:
        return None
    i = MODELLED_RELEASES.index(release)
    for first, last, at in WHERE.get(rule, ()):
        if MODELLED_RELEASES.index(first) <= i <= MODELLED_RELEASES.index(last):
            return at
    return None


class Release:
    """One release's rules applied to one config: ``has(rule)``, and ``refuse`` naming where."""

    def __init__(self, release: str, source: str, prefix: str = "") -> None:
        self.release, self.source, self.prefix = release, source, prefix

    def has(self, rule: str) -> bool:
        return where(rule, self.release) is not None

    def refuse(
        self,
        rule: str,
        key: str,
        value: object,
        why: str,
        error: str = "ValueError at load",
        *,
        raised: str | None = None,
    ) -> ConfigError:
        """``key``'s value, why the release refuses it, and how and where it fails: at ``rule``'s line,
        or at ``raised``'s where the check of ``rule`` leads to another that raises (its traceback's
        line), with ``rule``'s line after it."""
        at = f"{SRT}{where(rule, self.release)}"
        if raised is not None:
            at = f"{SRT}{where(raised, self.release)}, from {at}"
        return ConfigError(
            f"SGLang {self.release} cannot load {self.source}: {self.prefix}{key}={shorten(value)} {why} "
            f"({error}, {at}); {FIX}"
        )


# -- Nemotron-H ----------------------------------------------------------------------------------------------


# -- Qwen3-Next and Qwen3.5 ----------------------------------------------------------------------------------


# -- Kimi-Linear ---------------------------------------------------------------------------------------------


# -- Kimi-K3 ----------------------------------------------------------------------------------------------


# -- Falcon-H1 and Granite-4.0-H: the Mamba2 block's sizes --------------------------------------------------
