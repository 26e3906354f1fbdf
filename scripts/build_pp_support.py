#!/usr/bin/env python3
"""Build ``checker/core/releases/pp_support.py``: whether each modelled SGLang release starts each hybrid
model class under pipeline parallelism, and where in the release's code that is decided.

    python3 scripts/build_pp_support.py [--wheels DIR] [--src DIR]

For every release of ``checker.core.releases.releases.MODELLED_RELEASES`` it reads the release's code (the
unpacked sources under ``--src``/<version>/ when there, else the wheel, ``pip download --no-deps sglang==X``;
nothing is installed or imported): the model registry (which module holds each architecture, as
``scripts/build_model_support.py`` reads it), the model runner's ``support_pp`` assert, and each hybrid
class's own code through :func:`checker.engines.model_code.read_class` (its ``forward`` signature, the
asserts and the layer builder its constructor runs, its tied head, its ``load_weights``). One status per
(architecture, release), in the order SGLang would stop:

* ``single-stage``: the constructor asserts ``pp_group.is_first_rank and is_last_rank`` (first: the class
  is built before the model runner looks at it);
* ``no-pp``: ``forward`` takes no ``pp_proxy_tensors``; the model runner asserts ``support_pp`` under
  pp > 1 (0.5.5.post1+);
* ``all-layers``: every stage builds every layer (``make_layers`` without ``pp_rank``/``pp_size``, or
  ``make_layers_non_pp``) and its forward runs them all (see HAND_CHECKED for what that does);
* ``unfiltered-load``: the later stages hold no parameters of the earlier stages' layers, but
  ``load_weights`` indexes ``params_dict[name]`` for every checkpoint tensor: ``KeyError`` on every stage
  (with a tied head, the later stages already fail in the constructor);
* ``stages``: each stage builds and runs only its own layers: the class starts under PP.

A status the code reading gives is checked against HAND_CHECKED, findings made by building the class on
the meta device from the release's own code (``scripts/pp_meta_build.py``, in the CPU environments of
``scripts/sglang_cpu_env.sh``) or by reading code the static reader does not follow; a rebuild that
disagrees with one of them stops with the difference. tests/test_pp_support.py checks the table against
the sources of any release found.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

import sglang_wheels as wheels  # noqa: E402

from checker.core.releases.releases import MODELLED_RELEASES  # noqa: E402
from checker.engines.model_code import MODELS, Source, model_runner_assert, pipeline_status, read_class  # noqa: E402

TARGET = REPO / "checker" / "core" / "releases" / "pp_support.py"
HYBRID_ARCHITECTURES = (
    # model_type qwen3_next
    "Qwen3NextForCausalLM",
    # model_type qwen3_5 / qwen3_5_moe (the vision-language classes) and their text-only classes (0.5.17+)
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    # model_type kimi_linear
    "KimiLinearForCausalLM",
    # the kimi-k3 preset's class (its geometry's architecture, checker/families/kimi_k3) and its text-only one
    "KimiK3ForConditionalGeneration",
    "KimiK3LinearForCausalLM",
    # model_type nemotron_h, falcon_h1, granitemoehybrid
    "NemotronHForCausalLM",
    "FalconH1ForCausalLM",
    "GraniteMoeHybridForCausalLM",
)
"""The hybrid classes a config the checker reads (the checker.families registry) or a preset
names."""


@dataclass(frozen=True)
class HandCheck:
    """A status confirmed by running the release's code, or by reading what the static reader does not
    follow; the build fails if the code reading ever says otherwise for that release."""

    architecture: str
    release: str
    status: str
    evidence: str


HAND_CHECKED = (
    HandCheck(
        "GraniteMoeHybridForCausalLM",
        "0.5.23",
        "unfiltered-load",
        "built on the meta device from 0.5.23's code at pp 2 (scripts/pp_meta_build.py, tests/fixtures/"
        "granite_4_0_h_small.json): stage 1's constructor fails at granitemoehybrid.py:510 (AttributeError: "
        "'PPMissingLayer' object has no attribute 'weight': lm_head is tied to embed_tokens, which only "
        "stage 0 builds); stage 0 builds, and its load_weights raises KeyError: "
        "'model.layers.20.input_layernorm.weight' at :602 (params_dict[n], no stage filter)",
    ),
    HandCheck(
        "GraniteMoeHybridForCausalLM",
        "0.5.10",
        "unfiltered-load",
        "built on the meta device from 0.5.10's code at pp 2: the same two failures (granitemoehybrid.py:508 "
        "constructor, :600 KeyError in load_weights)",
    ),
    HandCheck(
        "KimiLinearForCausalLM",
        "0.5.9",
        "unfiltered-load",
        "built on the meta device from 0.5.9's code at pp 2 (tests/fixtures/kimi_linear_48b_a3b.json): both "
        "stages build their own layers, and their load_weights raise KeyError on the other stage's names "
        "(stage 0: 'model.layers.13.self_attn.o_norm.weight' at kimi_linear.py:797; its "
        "is_pp_missing_parameter checks are commented out); 0.5.17 adds _is_non_local_pp_weight",
    ),
    HandCheck(
        "KimiLinearForCausalLM",
        "0.5.23",
        "stages",
        "built on the meta device from 0.5.23's code at pp 2: each stage's load_weights takes the 13 / 14 "
        "layers' names it holds and skips the rest (_is_non_local_pp_weight)",
    ),
    HandCheck(
        "Qwen3_5MoeForConditionalGeneration",
        "0.5.9",
        "all-layers",
        "models/qwen3_5.py:692 make_layers without pp_rank/pp_size: every stage builds all 60 layers and "
        "the forward loops over all of them (:728); embed_tokens is built on the first stage only (:668) "
        "while managers/mm_utils.py:1074 general_mm_embed_routine calls get_input_embeddings() (:703, "
        "self.embed_tokens) on every stage, so each later stage fails at its first forward (the CUDA-graph "
        "capture at start-up)",
    ),
    HandCheck(
        "NemotronHForCausalLM",
        "0.5.7",
        "all-layers",
        "models/nemotron_h.py:540 make_layers_non_pp: every stage builds every layer, embedding and head "
        "included, and NemotronHModel.forward loops over all of them (:565) on the hidden states the "
        "previous stage sent: it starts, but each token passes through the whole model once per stage",
    ),
)


def release_source(version: str, wheels_dir: Path, src_dir: Path) -> tuple[Source, Path]:
    root = src_dir / version
    if (root / "sglang").is_dir():

        def from_dir(path: str) -> str | None:
            f = root / path
            return f.read_text(encoding="utf-8", errors="replace") if f.is_file() else None

        return from_dir, root
    wheel = wheels.fetch_wheel(version, wheels_dir)
    z = zipfile.ZipFile(wheel)
    names = set(z.namelist())

    def from_wheel(path: str) -> str | None:
        return z.read(path).decode("utf-8", "replace") if path in names else None

    return from_wheel, wheel


def read_release(
    version: str, wheels_dir: Path, src_dir: Path
) -> tuple[str | None, dict[str, tuple[str, str, str]]]:
    source, where = release_source(version, wheels_dir, src_dir)
    registered = wheels.registered_architectures(where)
    runner = model_runner_assert(source)
    out: dict[str, tuple[str, str, str]] = {}
    for arch in HYBRID_ARCHITECTURES:
        module = registered.get(arch)
        if module is None:
            continue
        reading = read_class(arch, f"{MODELS}{module}.py", source)
        if reading is None:
            raise SystemExit(f"{version}: {arch} is registered by models/{module}.py but not defined there")
        status = pipeline_status(reading, runner)
        if status is None:
            raise SystemExit(
                f"{version}: {arch} ({reading.path}): no layer builder found; read the class and add a "
                "hand-checked rule"
            )
        out[arch] = status
    return (str(runner) if runner else None), out


HEADER = '''\
# ruff: noqa: E501  (generated: one line per architecture and release)
"""Whether each modelled SGLang release starts each hybrid model class under pipeline parallelism
(GENERATED by ``scripts/build_pp_support.py`` from each release's code; do not edit).

``PIPELINE[arch][release] = (status, where, also)``: ``stages`` (each stage builds and runs its own
layers: it starts), ``single-stage`` (the constructor asserts one stage: ``where``), ``no-pp``
(``forward`` at ``where`` takes no ``pp_proxy_tensors``; ``also``: the model runner's assert),
``all-layers`` (every stage builds every layer at ``where`` and runs them all at ``also``),
``unfiltered-load`` (``load_weights`` at ``where`` has no stage filter; ``also``: a tied head the later
stages cannot build). Paths are under ``sglang/srt/``. A release that does not register the class has no
entry (:mod:`checker.core.releases.model_support` refuses it first). ``MODEL_RUNNER_ASSERT[release]``:
where the model runner asserts ``support_pp`` under pp > 1 (None up to 0.5.5).
"""

from __future__ import annotations

# fmt: off
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = Path.home() / ".cache" / "pp-checker"
    parser.add_argument("--wheels", type=Path, default=cache / "wheels")
    parser.add_argument("--src", type=Path, default=cache / "src", help="unpacked sources, <DIR>/<version>/")
    args = parser.parse_args(argv)
    runner: dict[str, str | None] = {}
    table: dict[str, dict[str, tuple[str, str, str]]] = {a: {} for a in HYBRID_ARCHITECTURES}
    for v in MODELLED_RELEASES:
        runner[v], found = read_release(v, args.wheels, args.src)
        for arch, entry in found.items():
            table[arch][v] = entry
        print(f"{v}: {', '.join(f'{a}={e[0]}' for a, e in found.items())}", file=sys.stderr)
    wrong = [
        f"{h.architecture} on {h.release}: the code reading says "
        f"{table[h.architecture].get(h.release, ('unregistered',))[0]}, the hand check {h.status}"
        for h in HAND_CHECKED
        if table[h.architecture].get(h.release, ("",))[0] != h.status
    ]
    if wrong:
        raise SystemExit("disagrees with a hand-checked finding: " + "; ".join(wrong))
    lines = [HEADER, "MODEL_RUNNER_ASSERT: dict[str, str | None] = {"]
    lines += [f"    {v!r}: {runner[v]!r}," for v in MODELLED_RELEASES]
    lines.append("}")
    lines.append("PIPELINE: dict[str, dict[str, tuple[str, str, str]]] = {")
    for arch in HYBRID_ARCHITECTURES:
        lines.append(f"    {arch!r}: {{")
        lines += [f"        {v!r}: {e!r}," for v, e in table[arch].items()]
        lines.append("    },")
    lines.append("}")
    lines.append("# fmt: on")
    TARGET.write_text("\n".join(lines) + "\n")
    print(
        f"wrote {TARGET.relative_to(REPO)}: {len(HYBRID_ARCHITECTURES)} classes over "
        f"{len(MODELLED_RELEASES)} releases"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
