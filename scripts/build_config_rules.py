#!/usr/bin/env python3
# ruff: noqa: E501  (a table: one line per rule, as SGLang writes its anchor)
"""Build ``checker/core/releases/config_lines.py``: where each modelled SGLang release's config class (and the model
class that reads its layer types) refuses a ``config.json`` of the six families the checker reads.

    python3 scripts/build_config_rules.py [--wheels DIR] [--src DIR]

Each rule of :data:`RULES` is one check of SGLang's code, found by text that only that check's line
holds (its anchor). For every release of
``checker.core.releases.releases.MODELLED_RELEASES`` the build reads the rule's file from the release's code (the
unpacked sources under ``--src``/<version>/ when there, else the wheel, as scripts/build_pp_support.py
does; nothing is installed or imported) and records ``file:line`` of the anchor, or nothing where the
release has no such check. What each rule refuses is written once, by hand, in
``checker/core/releases/config_rules.py`` (which applies the release's own regular expression and its own
alphabet where the rule has one); the table says which releases have it and where. A rule whose anchor
moved to another form of words in a new release is found nowhere: tests/test_config_rules.py then
fails on that release (every release that loads the family must have the checks its first release
had, or a successor).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from build_pp_support import release_source  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "config_lines.py"
SRT = "sglang/srt/"


@dataclass(frozen=True)
class Rule:
    name: str
    path: str
    """Under sglang/srt/."""
    anchor: str
    """Text only the rule's line holds (the first line that contains it is the rule's)."""
    nth: int = 0
    """The rule's line is the anchor's ``nth`` occurrence (0: the first)."""


RULES: tuple[Rule, ...] = (
    # -- Nemotron-H: configs/nemotron_h.py NemotronHConfig, models/nemotron_h.py NemotronHModel
    Rule("nemotron_h.pattern_length", "configs/nemotron_h.py", "len(self.hybrid_override_pattern) == self.num_hidden_layers"),
    Rule("nemotron_h.pattern_range", "configs/nemotron_h.py", 're.match(r"^[*-M]+$", self.hybrid_override_pattern)'),
    Rule("nemotron_h.pattern_regex", "configs/nemotron_h.py", 'r"^[*\\-ME]+$", self.hybrid_override_pattern'),
    Rule("nemotron_h.pattern_chars", "configs/nemotron_h.py", "if any(char not in {MAMBA, MOE, ATTENTION, MLP}"),
    Rule("nemotron_h.layers_block_type", "configs/nemotron_h.py", 'valid_types = {"mamba", "attention", "mlp", "moe"}'),
    Rule("nemotron_h.block_type_list", "configs/nemotron_h.py", "if not isinstance(layers_block_type, list):"),
    Rule("nemotron_h.mtp_pattern", "configs/nemotron_h.py", 'pattern = kwargs.pop("mtp_hybrid_override_pattern")'),
    Rule("nemotron_h.mtp_block_types", "configs/nemotron_h.py", 'mtp_layers_block_type, None, "mtp_layers_block_type"'),
    Rule("nemotron_h.layer_class", "models/nemotron_h.py", "layer_class = ALL_DECODER_LAYER_TYPES[config.hybrid_override_pattern[idx]]"),
    Rule("nemotron_h.moe_layer", "models/nemotron_h.py", "MOE: NemotronHMoEDecoderLayer,"),
    # -- Qwen3-Next and Qwen3.5: configs/qwen3_next.py Qwen3NextConfig (Qwen3_5TextConfig inherits it)
    Rule("qwen3_next.full_attention_interval", "configs/qwen3_next.py", "if (l + 1) % self.full_attention_interval == 0:"),
    Rule("qwen3_5.text_config", "configs/qwen3_5.py", 'self.text_config = self.sub_configs["text_config"]()'),
    # -- Kimi-Linear: configs/kimi_linear.py KimiLinearConfig
    Rule("kimi_linear.router_activation", "configs/kimi_linear.py", 'assert self.moe_router_activation_func in ("softmax", "sigmoid")'),
    Rule("kimi_linear.kda_layers", "configs/kimi_linear.py", 'assert linear_attn_config["kda_layers"] is not None'),
    Rule("kimi_linear.full_attn_layers", "configs/kimi_linear.py", 'assert linear_attn_config["full_attn_layers"] is not None'),
    # -- Falcon-H1: configs/falcon_h1.py FalconH1Config
    Rule("falcon_h1.d_ssm_default", "configs/falcon_h1.py", "mamba_d_ssm=1024,"),
    Rule("falcon_h1.heads_divide", "configs/falcon_h1.py", 'raise ValueError("mamba_n_heads must divide mamba_expand * hidden_size")'),
    Rule("falcon_h1.head_dim", "configs/falcon_h1.py", '"The dimensions for the Mamba head state do not match the model intermediate_size"'),
    # hybrid_gdn_params (0.5.3 only: 0.5.3.post1 sizes from mamba_intermediate): None + int when mamba_d_ssm is null
    Rule("falcon_h1.d_ssm_null_state", "configs/falcon_h1.py", "conv_dim = self.mamba_d_ssm + 2 * n_groups * self.mamba_d_state"),
    # load_weights (models/falcon_h1.py): the unguarded params_dict[name] of a tensor no stacked projection takes
    Rule("falcon_h1.load_unknown", "models/falcon_h1.py", "param = params_dict[name]", nth=1),
    # -- Kimi-K3: configs/kimi_k3.py KimiK3Config (its text_config is a KimiLinearConfig: the rules above)
    Rule("kimi_k3.config_class", "configs/kimi_k3.py", 'model_type = "kimi_k3"'),
    # -- Granite-4.0-H: configs/granitemoehybrid.py GraniteMoeHybridConfig
    Rule("granitemoehybrid.layer_types_length", "configs/granitemoehybrid.py", 'f"layer_types must have length equal to num_hidden_layers'),
    Rule("granitemoehybrid.layer_types_values", "configs/granitemoehybrid.py", 'f"Each element in layer_types must be either'),
    Rule("granitemoehybrid.layer_types_aliases", "configs/granitemoehybrid.py", 'aliases = {"linear_attention": MAMBA, "full_attention": ATTENTION}'),
    Rule("granitemoehybrid.heads_divide", "configs/granitemoehybrid.py", 'f"mamba_intermediate_size ({self.mamba_intermediate_size}) must be divisible by "'),
    Rule("granitemoehybrid.head_dim", "configs/granitemoehybrid.py", 'f"mamba_d_head ({mamba_d_head}) * mamba_n_heads ({mamba_n_heads}) must equal "'),
)  # fmt: skip


def find(rule: Rule, text: str | None) -> int | None:
    """The 1-based line a traceback of ``rule``'s refusal names in ``text`` (None: the anchor is not
    there): the ``assert`` or ``raise`` statement the anchor's line belongs to (its first line), or the
    ``raise`` that an ``if`` on the anchor's line guards; else the anchor's own line (a default, a lookup
    that raises, a dict entry)."""
    if text is None:
        return None
    lines = [i for i, t in enumerate(text.splitlines(), 1) if rule.anchor in t]
    if len(lines) <= rule.nth:
        return None
    line = lines[rule.nth]
    raising = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Assert, ast.Raise))]
    around = [n for n in raising if n.lineno <= line <= (n.end_lineno or n.lineno)]
    if around:
        return max(around, key=lambda n: n.lineno).lineno
    guarded = [n for n in raising if n.lineno == line + 1]
    return guarded[0].lineno if guarded else line


def read_release(version: str, wheels_dir: Path, src_dir: Path) -> dict[str, str]:
    """rule -> ``file:line`` for the rules ``version``'s code has."""
    source, _ = release_source(version, wheels_dir, src_dir)
    texts: dict[str, str | None] = {}
    out: dict[str, str] = {}
    for rule in RULES:
        if rule.path not in texts:
            texts[rule.path] = source(SRT + rule.path)
        line = find(rule, texts[rule.path])
        if line is not None:
            out[rule.name] = f"{rule.path}:{line}"
    return out


def runs(by_release: dict[str, str]) -> list[tuple[str, str, str]]:
    """{release: where} -> [(first, last, where)] over consecutive modelled releases."""
    out: list[tuple[str, str, str]] = []
    last_index = -2
    for i, v in enumerate(MODELLED_RELEASES):
        where = by_release.get(v)
        if where is None:
            continue
        if out and out[-1][2] == where and last_index == i - 1:
            out[-1] = (out[-1][0], v, where)
        else:
            out.append((v, v, where))
        last_index = i
    return out


HEADER = '''\
# ruff: noqa: E501  (generated: one line per rule and run of releases)
"""Where each modelled SGLang release's config class refuses a config.json of the families the checker
reads (GENERATED by ``scripts/build_config_rules.py`` from each release's code; do not edit).

``WHERE[rule] = ((first, last, where), ...)``: the releases from ``first`` to ``last`` (consecutive
modelled releases) have the check at ``where`` (``file:line`` under ``sglang/srt/``); a release in no run
has no such check. What each rule refuses: :mod:`checker.core.releases.config_rules`.
"""

from __future__ import annotations

# fmt: off
'''


def render(table: dict[str, dict[str, str]]) -> str:
    lines = [HEADER, "WHERE: dict[str, tuple[tuple[str, str, str], ...]] = {"]
    for rule in RULES:
        spans = runs(table.get(rule.name, {}))
        lines.append(f"    {rule.name!r}: (")
        lines += [f"        {span!r}," for span in spans]
        lines.append("    ),")
    lines += ["}", "# fmt: on", ""]
    return "\n".join(lines)


def build(wheels_dir: Path, src_dir: Path) -> dict[str, dict[str, str]]:
    table: dict[str, dict[str, str]] = {}
    for v in MODELLED_RELEASES:
        for rule, where in read_release(v, wheels_dir, src_dir).items():
            table.setdefault(rule, {})[v] = where
    return table


def main(argv: list[str] | None = None) -> int:
    cache = Path.home() / ".cache" / "pp-checker"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, default=cache / "wheels")
    parser.add_argument("--src", type=Path, default=cache / "src", help="unpacked sources, <DIR>/<version>/")
    args = parser.parse_args(argv)
    TARGET.write_text(render(build(args.wheels, args.src)))
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
