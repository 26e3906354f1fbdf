"""Green means SGLang starts this deployment: a class the release stops at start-up under PP is refused.

SGLang runs a model class under pipeline parallelism only if its constructor does not assert a single
stage, its ``forward`` takes ``pp_proxy_tensors`` (the model runner's ``support_pp``), each stage builds
and runs only its own layers, and its ``load_weights`` skips what another stage holds.
``checker/core/releases/pp_support.py`` records, per hybrid class and release, what the release's code does
(built from each release's sources by scripts/build_pp_support.py, which reads them through
checker/engines/model_code.py). What a user relies on: derive, plan, sweep and check refuse such a
deployment in one line naming the class, the release, the SGLang file:line and a way out that starts,
and accept that way out; the table says what the sources say (the ``slow`` test reads them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from checker.core.errors import FlagError
from checker.core.releases.model_support import (
    any_class_runs_under_pp,
    builds_all_layers,
    check_pipeline,
    first_release_under_pp,
    pipeline_status,
    runs_under_pp,
)
from checker.core.releases.pp_support import MODEL_RUNNER_ASSERT, PIPELINE
from checker.core.releases.releases import MODELLED_RELEASES, release_model
from checker.engines.model_code import ClassReading, Where, read_class
from checker.engines.model_code import pipeline_status as reading_status

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
QWEN3_NEXT = str(FIXTURES / "qwen3_next_80b_a3b.json")
FALCON = str(FIXTURES / "falcon_h1_0_5b.json")
QWEN35 = str(FIXTURES / "qwen3_5_397b_a17b.json")
GRANITE = str(FIXTURES / "granite_4_0_h_small.json")
SRC = Path(os.environ.get("CHECKER_SGLANG_SRC", Path.home() / ".cache" / "pp-checker" / "src"))
WHEELS = Path(os.environ.get("CHECKER_SGLANG_WHEELS", Path.home() / ".cache" / "pp-checker" / "wheels"))


# -- the refusal through every command ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "arch", "where"),
    [
        (QWEN3_NEXT, "Qwen3NextForCausalLM", "models/qwen3_next.py:1036"),
        (FALCON, "FalconH1ForCausalLM", "models/falcon_h1.py:456"),
    ],
    ids=["qwen3-next", "falcon-h1"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["derive", "--budget-gib", "8", "--sglang-version", "0.5.23"],
        ["plan", "--target-max-running-requests", "8", "--sglang-version", "0.5.23"],
        ["plan", "--suggest-partition", "--budget-gib", "8", "--sglang-version", "0.5.23"],
        ["sweep"],  # the builtin model of the newest release (no SGLang here)
    ],
    ids=["derive", "plan-target", "plan-partition", "sweep"],
)
def test_a_class_that_asserts_one_stage_is_refused_at_pp_2_and_runs_as_tp(cli, command, config, arch, where):
    """0.5.23's Qwen3-Next and Falcon-H1 assert a single stage in their constructor: every command
    refuses pp 2 x tp 1 in one line naming the class, the release, the assert's file:line and the same
    two GPUs as TP; that way out derives (plan never gets to print a fraction for the refused one)."""
    refused = cli([*command, "--model-config", config, "--pp-size", "2"])
    assert refused.rc == 2 and refused.out == "", refused.out[-300:]
    (line,) = refused.err.strip().splitlines()
    assert line.endswith(
        f"SGLang 0.5.23 cannot start {arch} at --pp-size 2: its constructor asserts a single pipeline "
        f"stage (sglang/srt/{where}); use --pp-size 1 --tp-size 2 (the same GPUs as tensor parallelism)"
    ), line
    ok = cli([*command, "--model-config", config, "--pp-size", "1", "--tp-size", "2"])
    assert ok.rc == 0, ok.err[-400:]


def test_the_way_out_names_tp_only_where_the_model_shards_over_it(cli):
    """Falcon-H1-0.5B has 24 mamba heads: pp 2 x tp 8 as tp 16 would not load, so the way out is one
    stage, not 16-way TP; pp 2 x tp 4 fits tp 8."""
    wide = cli(["derive", "--model-config", FALCON, "--pp-size", "2", "--tp-size", "8"])
    assert wide.rc == 2 and wide.err.strip().endswith("use --pp-size 1 (it does not shard over --tp-size 16)")
    narrow = cli(["derive", "--model-config", FALCON, "--pp-size", "2", "--tp-size", "4"])
    assert narrow.rc == 2 and "use --pp-size 1 --tp-size 8 (the same GPUs" in narrow.err


def test_a_launch_command_at_pp_2_is_refused_as_the_flags_are(cli, tmp_path):
    """The README's deployment shape, Qwen3-Next-80B at --pp-size 2 --tp-size 2 in a launch command:
    refused with the same line; --pp-size 1 --tp-size 4 derives."""
    model = tmp_path / "Qwen3-Next-80B-A3B"
    model.mkdir()
    (model / "config.json").write_text(Path(QWEN3_NEXT).read_text())
    serve = ["--", "python", "-m", "sglang.launch_server", "--model-path", str(model)]
    refused = cli(["derive", "--budget-gib", "8", *serve, "--pp-size", "2", "--tp-size", "2"])
    assert refused.rc == 2
    assert "cannot start Qwen3NextForCausalLM at --pp-size 2" in refused.err
    assert refused.err.strip().endswith("use --pp-size 1 --tp-size 4 (the same GPUs as tensor parallelism)")
    assert cli(["derive", "--budget-gib", "8", *serve, "--pp-size", "1", "--tp-size", "4"]).rc == 0


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10", "0.5.17", "0.5.23"])
def test_granite_4_h_is_refused_under_pp_on_every_release_that_loads_it(cli, release):
    """Granite-4.0-H takes pp_proxy_tensors, yet its load_weights indexes params_dict with no stage
    filter (KeyError on another stage's layers) and its head is tied to an embedding only the first
    stage builds: refused at pp 2 wherever it is registered (0.5.9+), accepted at pp 1."""
    status, where, also = pipeline_status(release, "GraniteMoeHybridForCausalLM")
    assert status == "unfiltered-load" and where.startswith("models/granitemoehybrid.py:") and also
    res = cli(["derive", "--model-config", GRANITE, "--pp-size", "2", "--sglang-version", release])
    assert res.rc == 2
    assert f"its load_weights has no stage filter (sglang/srt/{where}: KeyError" in res.err
    assert f"the later stages fail first, in the constructor (:{also.rsplit(':', 1)[1]})" in res.err
    assert cli(["derive", "--model-config", GRANITE, "--pp-size", "1", "--sglang-version", release]).rc == 0


def test_classes_that_split_their_layers_start_under_pp(cli):
    """kimi-k3 at pp 8 and Qwen3.5-397B at pp 2 on 0.5.23 derive (their classes build and run only their
    own stage's layers)."""
    assert cli(["derive", "--model", "kimi-k3", "--pp-size", "8", "--budget-gib", "8"]).rc == 0
    assert cli(["derive", "--model-config", QWEN35, "--pp-size", "2", "--budget-gib", "8"]).rc == 0
    assert runs_under_pp("0.5.23", "KimiK3ForConditionalGeneration")
    assert runs_under_pp("0.5.23", "Qwen3_5MoeForConditionalGeneration")


def test_a_release_that_builds_every_layer_on_every_stage_is_refused(cli):
    """Qwen3.5 on 0.5.9: make_layers without pp_rank/pp_size (qwen3_5.py:692) builds all 60 layers on
    every stage and the forward loops over all of them; later stages have no embed_tokens, which the
    forward reads on every stage. Refused, with 0.5.10 (the first release that splits them) as a way
    out; builds_all_layers says so for the weights-from-checkpoint code."""
    res = cli(["derive", "--model-config", QWEN35, "--pp-size", "2", "--sglang-version", "0.5.9"])
    assert res.rc == 2
    (line,) = res.err.strip().splitlines()
    assert line.startswith(
        "checker derive: error: SGLang 0.5.9 cannot start Qwen3_5MoeForConditionalGeneration"
    ), line
    assert (
        " at --pp-size 2: every stage builds every layer (sglang/srt/models/qwen3_5.py:692) and runs them "
        "all (:728)" in line
    ), line
    assert line.endswith(
        "use --pp-size 1 --tp-size 2 (the same GPUs as tensor parallelism) or SGLang 0.5.10 (the first "
        "release that starts it under PP)"
    ), line
    assert cli(["derive", "--model-config", QWEN35, "--pp-size", "2", "--sglang-version", "0.5.10"]).rc == 0
    assert builds_all_layers("0.5.9", "Qwen3_5MoeForConditionalGeneration")
    assert builds_all_layers("0.5.9", "Qwen3_5ForConditionalGeneration")
    assert not builds_all_layers("0.5.10", "Qwen3_5MoeForConditionalGeneration")
    nemotron = [v for v in MODELLED_RELEASES if builds_all_layers(v, "NemotronHForCausalLM")]
    assert (nemotron[0], nemotron[-1], len(nemotron)) == ("0.5.3.post1", "0.5.7", 15)
    assert first_release_under_pp("NemotronHForCausalLM", "0.5.7") == "0.5.8"


def test_every_table_entry_is_the_refusal_or_not() -> None:
    """check_pipeline refuses exactly the entries that are not ``stages``, naming the table's file:line
    (and the model runner's assert for a forward without pp_proxy_tensors); pp 1 is never refused."""
    for arch, by_release in PIPELINE.items():
        for release, (status, where, _) in by_release.items():
            check_pipeline(release, [arch], pp_size=1, tp_group_size=1, env={})
            if status == "stages":
                check_pipeline(release, [arch], pp_size=4, tp_group_size=2, env={})
                continue
            with pytest.raises(FlagError) as exc:
                check_pipeline(release, [arch], pp_size=4, tp_group_size=2, env={})
            text = str(exc.value)
            assert text.startswith(f"SGLang {release} cannot start {arch} at --pp-size 4: "), text
            assert f"(sglang/srt/{where}" in text and "--pp-size 1 --tp-size 8" in text, text
            if status == "no-pp" and MODEL_RUNNER_ASSERT[release]:
                assert MODEL_RUNNER_ASSERT[release] in text


def test_the_registry_picks_the_class_the_rule_applies_to() -> None:
    """SGLang takes the first architecture of the config's list its registry has: an unknown name first
    does not hide Qwen3-Next's refusal; an external model package (SGLANG_EXTERNAL_MODEL_PACKAGE) may
    register its own class, so nothing is refused then."""
    with pytest.raises(FlagError, match="cannot start Qwen3NextForCausalLM"):
        check_pipeline("0.5.23", ["NoSuchArch", "Qwen3NextForCausalLM"], pp_size=2, tp_group_size=1, env={})
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"}
    check_pipeline("0.5.23", ["Qwen3NextForCausalLM"], pp_size=2, tp_group_size=1, env=env)


def test_a_model_spec_is_held_to_the_releases_coarse_answer(cli, tmp_path):
    """A JSON model spec names no class: up to 0.5.7 no hybrid class the checker reads starts under PP
    (ReleaseRules.pp_hybrid, read from the same table), from 0.5.8 (Nemotron-H) one does."""
    spec = FIXTURES / "kimi_k3_shape_spec.json"
    first = next(v for v in MODELLED_RELEASES if any_class_runs_under_pp(v))
    assert first == "0.5.8"
    assert [g.pp_hybrid for g in map(lambda v: release_model(v).rules, MODELLED_RELEASES)] == [
        any_class_runs_under_pp(v) for v in MODELLED_RELEASES
    ]
    old = cli(["derive", "--model-config", str(spec), "--pp-size", "4", "--sglang-version", "0.5.7"])
    assert old.rc == 2 and "starts no hybrid (mamba / linear-attention) model class" in old.err
    assert old.err.strip().endswith("use --pp-size 1, or SGLang 0.5.8 or later")
    assert (
        cli(["derive", "--model-config", str(spec), "--pp-size", "4", "--sglang-version", "0.5.23"]).rc == 0
    )


# -- on real ranks -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_check_on_two_ranks_refuses_on_every_rank_with_its_report_and_junit(tmp_path):
    """check, 2 gloo ranks, Qwen3-Next at pp 2: the input-error verdict on every rank (exit 2), the
    report's error and the JUnit failure quote the line; the same 2 ranks as tp 2 are consistent."""
    from harness import run_world

    junit = tmp_path / "preflight.xml"
    base = ["check", "--model-config", QWEN3_NEXT, "--budget-gib", "8", "--timeout-s", "60"]
    res = run_world([*base, "--pp-size", "2", "--junit", str(junit)], world_size=2, tmp_path=tmp_path)
    assert res.codes == [2, 2], [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "error"
    line = "SGLang 0.5.23 cannot start Qwen3NextForCausalLM at --pp-size 2: its constructor asserts"
    assert rep["errors"] and all(line in e for e in rep["errors"]), rep["errors"]
    assert line in junit.read_text()
    ok = run_world([*base, "--pp-size", "1", "--tp-size", "2"], world_size=2, tmp_path=tmp_path)
    assert ok.codes == [0, 0], [r.stderr[-400:] for r in ok.ranks]
    assert ok.report()["status"] == "consistent"


# -- reading a class's code --------------------------------------------------------------------------------


def _source(files: dict[str, str]):
    return lambda path: files.get(path)


MODEL = "sglang/srt/models/m.py"
HEAD = "import torch\nfrom torch import nn\n"


def _read(body: str, arch: str = "M", extra: dict[str, str] | None = None) -> ClassReading:
    reading = read_class(arch, MODEL, _source({MODEL: HEAD + body, **(extra or {})}))
    assert reading is not None
    return reading


def test_a_constructor_assert_of_one_stage_is_found_where_it_is() -> None:
    r = _read(
        "class M(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.pp_group = get_pp_group()\n"
        "        assert self.pp_group.is_first_rank and self.pp_group.is_last_rank\n"
        "        self.layers = make_layers(4, f)\n"
        "    def forward(self, input_ids, positions, forward_batch):\n"
        "        pass\n"
    )
    assert r.single_stage == Where(MODEL, 6) and not r.takes_proxy
    assert reading_status(r, None) == ("single-stage", "models/m.py:6", "")


def test_an_assert_of_either_rank_is_not_one_of_one_stage() -> None:
    """``assert a.is_first_rank or a.is_last_rank`` refuses nothing: only the conjunction is the rule."""
    r = _read(
        "class M(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        assert self.pp_group.is_first_rank or self.pp_group.is_last_rank\n"
        "        self.layers, self.start_layer, self.end_layer = make_pp_layers(4, f)\n"
        "    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):\n"
        "        pass\n"
    )
    assert r.single_stage is None and reading_status(r, None)[0] == "stages"


def test_the_forward_and_the_layers_come_from_the_classes_built() -> None:
    """The entry class inherits forward from a base in another module, builds its body through a default
    class argument (Qwen3-VL's ``language_model_cls``), and the body builds its layers without pp_rank:
    every stage builds every layer, and its forward loops over them all."""
    base = "sglang/srt/models/base.py"
    r = _read(
        "from sglang.srt.models.base import VLBase\n"
        "class Body(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.layers = make_layers(config.n, f, prefix='layers')\n"
        "    def forward(self, x, pp_proxy_tensors=None):\n"
        "        for layer in self.layers:\n"
        "            x = layer(x)\n"
        "class M(VLBase):\n"
        "    def __init__(self, config, language_model_cls=Body):\n"
        "        super().__init__(config, language_model_cls)\n",
        extra={
            base: "class VLBase(nn.Module):\n"
            "    def __init__(self, config, language_model_cls=None):\n"
            "        self.model = language_model_cls(config)\n"
            "    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):\n"
            "        pass\n"
        },
    )
    assert r.forward == Where(base, 4) and r.takes_proxy
    assert (r.layers, r.layers_at, r.runs_all_at) == ("all", Where(MODEL, 6), Where(MODEL, 8))
    assert reading_status(r, None) == ("all-layers", "models/m.py:6", "models/m.py:8")


def test_make_layers_with_the_stage_builds_only_its_own() -> None:
    r = _read(
        "class M(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.model = self._init_model(config)\n"
        "    def _init_model(self, config):\n"
        "        return Body(config)\n"
        "    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):\n"
        "        pass\n"
        "class Body(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.layers, self.start_layer, self.end_layer = make_layers(\n"
        "            config.n, f, pp_rank=self.pp_group.rank_in_group, pp_size=self.pp_group.world_size)\n"
    )
    assert (r.layers, r.layers_at) == ("stage", Where(MODEL, 12))
    assert reading_status(r, None) == ("stages", "models/m.py:12", "")


def test_a_forward_without_proxy_tensors_is_what_the_model_runner_asserts() -> None:
    runner = Where("sglang/srt/model_executor/model_runner.py", 514)
    r = _read(
        "class M(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.layers, s, e = make_pp_layers(4, f)\n"
        "    def forward(self, input_ids, positions, forward_batch, **kwargs):\n"
        "        pass\n"
    )
    assert reading_status(r, runner) == ("no-pp", "models/m.py:6", "model_executor/model_runner.py:514")


def test_an_unfiltered_load_and_an_unguarded_tie_are_found() -> None:
    """Granite's shape: the head tied to an embedding only the first stage builds, with no PP guard, and a
    load_weights that indexes params_dict without any stage filter."""
    body = (
        "class Body(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        if self.pp_group.is_first_rank:\n"
        "            self.embed_tokens = VocabParallelEmbedding(1, 2)\n"
        "        else:\n"
        "            self.embed_tokens = PPMissingLayer()\n"
        "        self.layers, s, e = make_pp_layers(4, f)\n"
        "class M(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        self.model = Body(config)\n"
        "        self.lm_head = ParallelLMHead(1, 2)\n"
        "        if config.tie_word_embeddings:\n"
        "            self.lm_head.weight = self.model.embed_tokens.weight\n"
        "    def forward(self, input_ids, positions, forward_batch, pp_proxy_tensors=None):\n"
        "        pass\n"
        "    def load_weights(self, weights):\n"
        "        params_dict = dict(self.named_parameters())\n"
        "        for n, p in weights:\n"
        "            params_dict[n].copy_(p)\n"
    )
    r = _read(body)
    assert (r.tied_head, r.unfiltered_load) == (Where(MODEL, 15), Where(MODEL, 21))
    assert reading_status(r, None) == ("unfiltered-load", "models/m.py:21", "models/m.py:15")
    guarded = body.replace(
        "            params_dict[n]", "            if n in params_dict:\n                params_dict[n]"
    )
    assert _read(guarded).unfiltered_load is None
    # Kimi-Linear up to 0.5.16: a membership test on one path only (a GPTQ bias) guards nothing else.
    bias_only = body.replace(
        "            params_dict[n].copy_(p)",
        "            if n.endswith('.bias') and n not in params_dict:\n                continue\n"
        "            params_dict[n].copy_(p)",
    )
    assert _read(bias_only).unfiltered_load == Where(MODEL, 23)
    skipped = body.replace(
        "            params_dict[n].copy_(p)",
        "            if n not in params_dict:\n                continue\n            params_dict[n].copy_(p)",
    )
    assert _read(skipped).unfiltered_load is None
    # Kimi-Linear 0.5.17+: the stage's layer range behind a method of the class.
    method = body.replace(
        "            params_dict[n].copy_(p)",
        "            if self._is_non_local(n):\n                continue\n"
        "            params_dict[n].copy_(p)",
    ) + (
        "    def _is_non_local(self, name):\n"
        "        return not (self.model.start_layer <= layer_of(name) < self.model.end_layer)\n"
    )
    assert _read(method).unfiltered_load is None
    pp_tie = body.replace("if config.tie_word_embeddings:", "if self.pp_group.world_size == 1:")
    assert _read(pp_tie).tied_head is None


# -- the table is what each release's code says -------------------------------------------------------------


# The table against each release's own code, every modelled release read again by
# scripts/build_pp_support.py and compared byte for byte: tests/test_generated.py (slow).


def test_the_hand_checked_findings_are_in_the_table() -> None:
    """The findings made by running the release's code (scripts/pp_meta_build.py) or by reading what the
    code reader does not follow are what the table says for that release."""
    sys.path.insert(0, str(REPO / "scripts"))
    import build_pp_support

    for h in build_pp_support.HAND_CHECKED:
        assert pipeline_status(h.release, h.architecture)[0] == h.status, h


# -- the installed release's own class --------------------------------------------------------------------


@pytest.mark.sglang
@pytest.mark.parametrize(
    "family",
    [
        "qwen3_next_80b_a3b",
        "falcon_h1_0_5b",
        "granite_4_0_h_small",
        "qwen3_5_397b_a17b",
        "kimi_linear_48b_a3b",
        "nemotron_h_8b",
    ],
)
def test_the_engine_reads_the_installed_class_as_the_table_does(sglang_engine, family: str) -> None:
    """--engine sglang judges the installed class by its own code (read from the installed files): for the
    installed modelled release its answer at pp 2 is the table's, with the same file:line."""
    from checker.core.sizing.geometry import resolve_dtypes
    from checker.core.sizing.models import read_json
    from checker.core.sizing.sizing import CapacityInputs
    from checker.engines import ModelSource
    from checker.families.geometry import load_geometry

    config = str(FIXTURES / f"{family}.json")
    arch = read_json(config)["architectures"][0]
    entry = pipeline_status(sglang_engine.version, arch)
    if entry is None:
        pytest.skip(f"SGLang {sglang_engine.version} does not register {arch}")
    g = resolve_dtypes(load_geometry(model_config=config), env={})
    inputs = CapacityInputs(geometry=g, budget_gib=8.0, pp_size=2, sglang_version=sglang_engine.version)
    if entry[0] == "stages":
        sglang_engine.check_pipeline(inputs, ModelSource(model_config=config))
        return
    with pytest.raises(FlagError) as exc:
        sglang_engine.check_pipeline(inputs, ModelSource(model_config=config))
    assert f"cannot start {arch} at --pp-size 2" in str(exc.value)
    assert f"(sglang/srt/{entry[1]}" in str(exc.value), (str(exc.value), entry)
