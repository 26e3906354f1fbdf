"""One pipeline of one model, or not green (issue 27 item 1).

Three equal values do not make a deployment: a rank that reads another partition or another config.json
holds another slice, and the stages stop tiling the model while every pool size agrees. The issue's two
cases (4 ranks, qwen3-next's 48 layers): rank 1 alone exports SGLANG_PP_LAYER_PARTITION=11,13,12,12
(rank 0 holds [0, 12), rank 1 [11, 24): layer 11 on two stages), and rank 0 alone loads a 44-layer
config.json (rank 0 [0, 11), rank 1 [12, 24): layer 11 on none). Both were CONSISTENT, exit 0.

In-process, each rank is built as a node builds it (tests/test_one_cause.py: the real parser, the launch
merge, derive_row, the wire's round trip) and then on hand-made rows for every rule; on real gloo ranks
(tests/harness.py), one case in the quick suite and the other under ``slow``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from harness import run_world
from rank_rows import world
from test_one_cause import Node, _rank_row

from checker.distributed.wire import decode_row, digest, encode_row
from checker.outputs.report import one_line, to_json, to_junit, to_markdown, to_text
from checker.preflight.pipeline import pipeline_faults
from checker.preflight.verdict import decide

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# A GatedDeltaNet model of 48 layers whose class starts under PP (Qwen3.5's config at Qwen3-Next's size:
# Qwen3-Next itself asserts a single stage in every release, checker/core/releases/pp_support.py).
QWEN3_NEXT = json.loads((FIXTURES / "qwen3_5_gdn_small.json").read_text())  # 48 layers
PARTITION = "SGLANG_PP_LAYER_PARTITION"
OVERLAP_LINE = (
    "pipeline: layer 11 is on two stages: rank 0 holds [0, 12) (pp_rank 0), rank 1 holds [11, 24) "
    f"(pp_rank 1); these ranks differ in {PARTITION}"
)


def _qwen(num_layers: int = 48) -> str:
    text = QWEN3_NEXT["text_config"]
    layers = {"num_hidden_layers": num_layers, "layer_types": text["layer_types"][:num_layers]}
    return json.dumps({**QWEN3_NEXT, "text_config": {**text, **layers}})


def _node(tmp_path: Path, **kw) -> Node:
    return Node(argv=("--model-config", str(tmp_path / "model"), "--budget-gib", "8"), **kw)


def _verdict(nodes: list[Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    rows = [_rank_row(node, r, tmp_path, monkeypatch) for r, node in enumerate(nodes)]
    return decide(rows, world_size=len(rows))


# -- the two cases, each rank built as its node builds it ----------------------------------------


def test_a_partition_on_rank_1_alone_puts_layer_11_on_two_stages(tmp_path, monkeypatch) -> None:
    same = _node(tmp_path, model_json=_qwen())
    odd = _node(tmp_path, model_json=_qwen(), env=((PARTITION, "11,13,12,12"),))
    v = _verdict([same, odd, same, same], tmp_path, monkeypatch)
    # Every value agrees: only the pipeline makes it divergent.
    assert (v.status, v.exit_code, v.divergent) == ("divergent", 1, [])
    assert [(r.start_layer, r.end_layer) for r in v.rows] == [(0, 12), (11, 24), (24, 36), (36, 48)]
    (fault,) = v.pipeline
    assert (fault.kind, fault.ranks, fault.layers, fault.inputs) == ("overlap", [0, 1], (11, 12), [PARTITION])
    assert v.root_causes == [
        OVERLAP_LINE,
        f"{PARTITION}: ranks 0, 2-3 leave it unset; rank 1 sets {PARTITION}=11,13,12,12 (on node-0)",
    ]
    assert v.warnings == []  # not "inputs differ although every value agrees": it is a divergence


def test_a_44_layer_config_on_rank_0_alone_leaves_layer_11_on_no_stage(tmp_path, monkeypatch) -> None:
    """The same path on every node, another file on rank 0's: another model, never only a warning."""
    v = _verdict(
        [_node(tmp_path, model_json=_qwen(44))] + [_node(tmp_path, model_json=_qwen())] * 3,
        tmp_path,
        monkeypatch,
    )
    assert (v.status, v.exit_code, v.divergent) == ("divergent", 1, [])
    assert [(r.start_layer, r.end_layer, r.num_layers) for r in v.rows] == [
        (0, 11, 44),
        (12, 24, 48),
        (24, 36, 48),
        (36, 48, 48),
    ]
    model, gap = v.pipeline
    assert (model.kind, model.ranks, model.inputs) == ("model", [0, 1, 2, 3], ["model"])
    assert "ranks 1-3 load" in model.text and "(48 layers)" in model.text and "(44 layers)" in model.text
    assert (gap.kind, gap.ranks, gap.layers, gap.inputs) == ("gap", [0, 1], (11, 12), ["model"])
    assert v.root_causes[1] == (
        "pipeline: layer 11 is on no stage: rank 0 holds [0, 11) (pp_rank 0), rank 1 holds [12, 24) "
        "(pp_rank 1); these ranks differ in model"
    )
    # The model's own line names the file (its path and digest) on each side.
    assert v.root_causes[2].startswith("model: ranks 1-3 load ") and "config.json" in v.root_causes[2]


def test_one_model_under_two_paths_is_one_model(tmp_path, monkeypatch) -> None:
    """The same config.json content at another path: the ``model`` input differs (a warning, as before),
    the definition does not: no fault, consistent."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(_qwen())
    moved = Node(argv=("--model-config", str(tmp_path / "elsewhere"), "--budget-gib", "8"))
    v = _verdict([_node(tmp_path, model_json=_qwen())] * 3 + [moved], tmp_path, monkeypatch)
    assert (v.status, v.pipeline, v.differing_inputs) == ("consistent", [], ["model"])


def test_another_definition_with_the_same_layers_is_divergent(tmp_path, monkeypatch) -> None:
    """Another config.json with the same layer count and slices, values that happen to agree: another
    model on ranks 2-3 is a divergence, not a warning."""
    other = json.dumps({**QWEN3_NEXT, "transformers_version": "9.9.9"})
    v = _verdict(
        [_node(tmp_path, model_json=_qwen())] * 2 + [_node(tmp_path, model_json=other)] * 2,
        tmp_path,
        monkeypatch,
    )
    assert (v.status, v.divergent) == ("divergent", [])
    (fault,) = v.pipeline
    assert (fault.kind, fault.inputs) == ("model", ["model"])


# -- every rule, on rows built by hand ---------------------------------------------------------------------


def _rows(slices, *, pp_size=None, num_layers=8, tp=1, **changes):
    """One row per (start, end), in rank order; ``tp`` ranks to a stage."""
    n = len(slices)
    rows = world(n)
    out = []
    for r, (row, (s, e)) in enumerate(zip(rows, slices, strict=True)):
        out.append(
            replace(
                row,
                pp_rank=r // tp,
                tp_rank=r % tp,
                pp_size=pp_size or n // tp,
                tp_size=tp,
                start_layer=s,
                end_layer=e,
                num_layers=num_layers,
                model_digest=7,
                **changes,
            )
        )
    return out


def _kinds(rows) -> list[tuple[str, tuple[int, int] | None, list[int]]]:
    return [(f.kind, f.layers, f.ranks) for f in pipeline_faults(rows, [])]


def test_stages_that_tile_the_model_have_no_fault() -> None:
    assert _kinds(_rows([(0, 3), (3, 6), (6, 8)])) == []
    assert _kinds(_rows([(0, 4), (0, 4), (4, 8), (4, 8)], tp=2)) == []
    assert _kinds(_rows([(0, 8)])) == []


@pytest.mark.parametrize(
    ("slices", "expected", "text"),
    [
        ([(1, 4), (4, 8)], [("gap", (0, 1), [0])], "layer 0 is on no stage: the first stage starts at 1"),
        ([(0, 4), (4, 6)], [("gap", (6, 8), [1])], "layers [6, 8) are on no stage: the model has 8 layers"),
        ([(0, 4), (4, 9)], [("beyond", (8, 9), [1])], "layer 8 is past the model's 8 layers"),
        ([(0, 3), (5, 8)], [("gap", (3, 5), [0, 1])], "layers [3, 5) are on no stage"),
        ([(0, 5), (3, 8)], [("overlap", (3, 5), [0, 1])], "layers [3, 5) are on two stages"),
        (
            [(4, 8), (0, 4)],
            [("gap", (0, 4), [0]), ("order", None, [0, 1]), ("gap", (4, 8), [1])],
            "lies before",
        ),
    ],
)
def test_each_break_in_the_walk_is_named_with_its_layers(slices, expected, text) -> None:
    faults = pipeline_faults(_rows(slices), [])
    assert [(f.kind, f.layers, f.ranks) for f in faults] == expected
    assert any(text in f.text for f in faults), [f.text for f in faults]


def test_the_ranks_of_one_stage_hold_one_slice() -> None:
    """pp 2 x tp 2: rank 3 (pp_rank 1) holds another slice than rank 2, its TP peer."""
    faults = pipeline_faults(_rows([(0, 4), (0, 4), (4, 8), (3, 8)], tp=2), [])
    assert [(f.kind, f.ranks) for f in faults] == [("slice", [2, 3]), ("overlap", [0, 1, 3])]
    assert faults[0].text.startswith("pp_rank 1 is not one slice: rank 2 holds [4, 8) (pp_rank 1); rank 3")


def test_ranks_that_run_another_number_of_stages_are_named_alone() -> None:
    """Ranks 2-3 run 2 stages, ranks 0-1 run 4: stage k of one layout is not stage k of the other, so no
    walk is made across them (it would name gaps that are not there)."""
    rows = _rows([(0, 2), (2, 4), (4, 8), (4, 8)], pp_size=4)
    rows[2:] = [replace(r, pp_size=2, pp_rank=1) for r in rows[2:]]
    (fault,) = pipeline_faults(rows, [])
    assert (fault.kind, fault.text.split(";")[:2]) == (
        "stages",
        ["not one number of stages: ranks 0-1 run 4 stages", " ranks 2-3 run 2 stages"],
    )


def test_the_fault_names_only_the_inputs_that_differ_across_its_ranks() -> None:
    """Two inputs differ across the world, only one across the two ranks of the overlap."""
    rows = _rows([(0, 5), (3, 6), (6, 8)])

    def with_input(row, name, value):
        inputs = {**row.inputs, name: value}
        return replace(row, inputs=inputs, input_digests={k: digest(v) for k, v in inputs.items()})

    rows[1] = with_input(rows[1], PARTITION, "3,3,2")
    rows[2] = with_input(rows[2], "page_size", "64")
    (fault,) = pipeline_faults(rows, [PARTITION, "page_size"])
    assert (fault.kind, fault.inputs) == ("overlap", [PARTITION])
    assert fault.text.endswith(f"these ranks differ in {PARTITION}")
    # An input that does not place layers is never the cause named.
    (fault,) = pipeline_faults(rows, ["page_size"])
    assert fault.inputs == [] and "every input that places layers agrees" in fault.text


def test_a_row_survives_the_wire_with_its_model_and_launch_digests() -> None:
    (row,) = _rows([(0, 8)])
    row = replace(row, num_layers=48, model_digest=0xFFFFFFFF, launch_digest=-(2**63))
    back = decode_row(encode_row(row))
    assert (back.num_layers, back.model_digest, back.launch_digest) == (48, 0xFFFFFFFF, -(2**63))


# -- every rendering says it ---------------------------------------------------------------------------


def test_every_rendering_names_the_broken_pipeline(tmp_path, monkeypatch) -> None:
    import jsonschema
    from test_report_schema import SCHEMA

    same = _node(tmp_path, model_json=_qwen())
    odd = _node(tmp_path, model_json=_qwen(), env=((PARTITION, "11,13,12,12"),))
    v = _verdict([same, odd, same, same], tmp_path, monkeypatch)
    doc = json.loads(json.dumps(to_json(v, extra={"checker_version": "x"})))
    jsonschema.validate(doc, SCHEMA)
    assert doc["pipeline"] == {
        "num_layers": 48,
        "faults": [
            {
                "kind": "overlap",
                "ranks": [0, 1],
                "layers": [11, 12],
                "inputs": [PARTITION],
                "text": OVERLAP_LINE.removeprefix("pipeline: "),
            }
        ],
    }
    assert [r["num_layers"] for r in doc["ranks"]] == [48] * 4
    text = to_text(v, summary="s", elapsed_s=1.0).splitlines()
    assert text[2:4] == ["root cause:", f"  {OVERLAP_LINE}"] and text[-1] == "verdict: divergent (exit 1)"
    assert one_line(v).startswith(
        f"checker verdict divergent: the stages are not one pipeline of one model (root cause: {OVERLAP_LINE}"
    )
    junit = to_junit(v, elapsed_s=1.0)
    assert 'name="pipeline"' in junit and 'failures="1"' in junit and "layer 11 is on two stages" in junit
    assert "**Root cause:**" in to_markdown(v, summary="s")


# -- on real gloo ranks ----------------------------------------------------------------------------------


def _model_dir(tmp_path: Path, name: str, num_layers: int) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(_qwen(num_layers))
    return d


def test_real_ranks_partition_on_rank_1_alone_is_divergent(tmp_path) -> None:
    """The issue's first case on real gloo ranks, 2 of them to keep the quick suite quick (the 4 of the
    issue run under ``slow``): rank 1 alone exports 11,37, so it holds [11, 48) while rank 0 holds
    [0, 24). Every rank exits 1 and the report names layers 11-23 and the variable."""
    model = _model_dir(tmp_path, "m", 48)
    res = run_world(
        ["check", "--model-config", str(model), "--budget-gib", "8", "--timeout-s", "60"],
        world_size=2,
        tmp_path=tmp_path,
        rank_env={1: {PARTITION: "11,37"}},
    )
    assert res.codes == [1, 1], [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "divergent"
    assert rep["root_causes"][0] == (
        "pipeline: layers [11, 24) are on two stages: rank 0 holds [0, 24) (pp_rank 0), rank 1 holds "
        f"[11, 48) (pp_rank 1); these ranks differ in {PARTITION}"
    )
    assert [(f["kind"], f["layers"]) for f in rep["pipeline"]["faults"]] == [("overlap", [11, 24])]


@pytest.mark.slow
def test_real_ranks_partition_on_rank_1_of_4_alone_is_divergent(tmp_path) -> None:
    """The issue's first case exactly: 4 real gloo ranks, rank 1 alone exports 11,13,12,12."""
    model = _model_dir(tmp_path, "m", 48)
    res = run_world(
        ["check", "--model-config", str(model), "--budget-gib", "8", "--timeout-s", "60"],
        world_size=4,
        tmp_path=tmp_path,
        rank_env={1: {PARTITION: "11,13,12,12"}},
    )
    assert res.codes == [1] * 4, [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "divergent" and rep["divergent"] == []
    assert rep["root_causes"][0] == OVERLAP_LINE
    assert [(f["kind"], f["layers"]) for f in rep["pipeline"]["faults"]] == [("overlap", [11, 12])]


@pytest.mark.slow
def test_real_ranks_44_layer_config_on_rank_0_alone_is_divergent(tmp_path) -> None:
    """The issue's second case on 4 real gloo ranks: rank 0 reads another config.json (44 layers)."""
    base = ["check", "--budget-gib", "8", "--timeout-s", "60", "--model-config"]
    res = run_world(
        [*base, str(_model_dir(tmp_path, "m48", 48))],
        world_size=4,
        tmp_path=tmp_path,
        rank_argv={0: [*base, str(_model_dir(tmp_path, "m44", 44))]},
    )
    assert res.codes == [1] * 4, [r.stderr[-400:] for r in res.ranks]
    rep = res.report()
    assert rep["status"] == "divergent" and rep["pipeline"]["num_layers"] is None
    assert [(f["kind"], f["layers"], f["inputs"]) for f in rep["pipeline"]["faults"]] == [
        ("model", None, ["model"]),
        ("gap", [11, 12], ["model"]),
    ]
    assert "layer 11 is on no stage" in res.ranks[0].stdout
