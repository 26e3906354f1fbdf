"""Root causes name only what was given (issue 27 item 5).

A rank's inputs hold the flags as the user typed them, on the checker's command line or in the launch
command: never a value a release's parser defaults to, nor a size the rank works out (the attention TP
of --tp-size 2 with attention DP 2, the pp size of a world without --pp-size). Each rank is built as its
node builds it (tests/test_one_cause.py: the real parser and launch merge, derive_row, the wire).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_one_cause import KIMI_LINEAR, SERVE, Node, _rank_row

from checker.cli.main import main
from checker.outputs.report import launch_command_json
from checker.preflight.verdict import decide

CHECKER = ("--budget-gib", "8")


def _model(tmp_path: Path) -> str:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(KIMI_LINEAR)
    return str(d)


def _rows(nodes, tmp_path, monkeypatch):
    return [_rank_row(node, r, tmp_path, monkeypatch) for r, node in enumerate(nodes)]


def test_attention_dp_on_ranks_2_3_is_named_as_typed(tmp_path, monkeypatch) -> None:
    """pp 2 x --tp-size 2 everywhere; ranks 2-3 add attention DP 2. It was named "ranks 2-3 have
    --tp-size=1" (their attention TP, which nobody typed) and "ranks 0-1 have --dp-size=1"."""
    base = (*SERVE, "--model-path", _model(tmp_path), "--pp-size", "2", "--tp-size", "2")
    dp = (*base, "--enable-dp-attention", "--dp-size", "2")
    rows = _rows(
        [Node(argv=CHECKER, launch=base)] * 2 + [Node(argv=CHECKER, launch=dp)] * 2, tmp_path, monkeypatch
    )
    v = decide(rows, world_size=4)
    assert v.differing_inputs == ["attention_layout"]
    assert v.root_causes == [
        "attention_layout: ranks 0-1 have --tp-size 2; ranks 2-3 have --tp-size 2 --enable-dp-attention "
        "--dp-size 2 (on node-1)"
    ]
    # What each rank derives with is still reported: attention TP 2 / DP 1 against 1 / 2.
    assert [(r.inputs["tp_size"], r.inputs["dp_size"]) for r in rows] == [("2", "1")] * 2 + [("1", "2")] * 2


def test_a_release_parser_default_is_never_an_input(tmp_path, monkeypatch) -> None:
    """SGLang 0.5.16 on rank 3 reads the launch command with its own table, whose
    --mamba-full-memory-ratio defaults to 0.9: the release is the cause, not a flag nobody gave."""
    launch = (*SERVE, "--model-path", _model(tmp_path), "--pp-size", "4")
    nodes = [Node(argv=CHECKER, launch=launch, installed="0.5.23")] * 3
    nodes.append(Node(argv=CHECKER, launch=launch, installed="0.5.16"))
    rows = _rows(nodes, tmp_path, monkeypatch)
    v = decide(rows, world_size=4)
    assert v.differing_inputs == ["sglang_installed"], v.root_causes
    assert {r.inputs["mamba_full_memory_ratio"] for r in rows} == {None}
    assert {r.inputs["pp_size"] for r in rows} == {"4"}  # typed: kept


def test_dp_size_without_pp_size_is_not_named_under_pp_size(tmp_path, monkeypatch) -> None:
    """Ranks 2-3 give --dp-size 2 and no --pp-size: they work out pp 2 from the world, ranks 0-1 pp 4.
    What they typed is --dp-size 2; "ranks 2-3 have --pp-size=2" named a flag nobody gave."""
    base = ("--model", "kimi-k3", *CHECKER)
    rows = _rows([Node(argv=base)] * 2 + [Node(argv=(*base, "--dp-size", "2"))] * 2, tmp_path, monkeypatch)
    v = decide(rows, world_size=4)
    assert "pp_size" not in v.differing_inputs
    assert v.input_causes == [
        "attention_layout: ranks 0-1 give no --tp-size or attention-DP flag; ranks 2-3 have --dp-size 2 "
        "(on node-1)"
    ]
    # The stages themselves differ (4 against 2): the pipeline says so, naming the flag as the cause.
    (fault,) = v.pipeline
    assert fault.kind == "stages" and fault.inputs == ["attention_layout"]


def test_launch_command_groups_follow_the_whole_command(tmp_path, monkeypatch) -> None:
    """Ranks 2-3 run --max-running-requests 8 (a flag compared as its own input), rank 1 another --port
    (no sizing flag): four ranks, three commands, three groups (it was one group)."""
    base = (*SERVE, "--model-path", _model(tmp_path), "--pp-size", "4", "--port", "30000")
    nodes = [
        Node(argv=CHECKER, launch=base),
        Node(argv=CHECKER, launch=(*base[:-1], "30001")),
        Node(argv=CHECKER, launch=(*base, "--max-running-requests", "8")),
        Node(argv=CHECKER, launch=(*base, "--max-running-requests", "8")),
    ]
    rows = _rows(nodes, tmp_path, monkeypatch)
    groups = launch_command_json(None, rows)["groups"]
    assert [g["ranks"] for g in groups] == [[2, 3], [0], [1]]
    assert len({g["sha256_prefix"] for g in groups}) == 3
    # rank 0's and rank 1's commands differ in no sizing input: one input digest, two commands.
    assert groups[1]["input_digest"] == groups[2]["input_digest"]


def test_a_launch_default_is_not_quoted_as_the_launch_commands_value(capsys) -> None:
    """--pp-size 2 with a launch command that gives no --pp-size: refused (the server runs SGLang's
    default), but not as "--pp-size 1 in the launch command", which nobody typed."""
    model = str(Path(__file__).resolve().parent / "fixtures" / "launch-model")
    code = main(
        ["derive", "--sglang-version", "0.5.16", "--pp-size", "2", "--", *SERVE, "--model-path", model]
    )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "--pp-size 2 disagrees with the launch command, which does not give --pp-size" in line
    assert "SGLang 0.5.16 then uses 1" in line


@pytest.mark.parametrize(
    ("launch", "typed"),
    [
        (["--tp-size", "4"], "--tp-size 4"),
        (["--tp-size", "4", "--dp-size", "2"], "--tp-size 4"),  # replicas, not attention DP: not layout
        (
            ["--tp-size", "4", "--enable-dp-attention", "--dp-size", "2"],
            "--tp-size 4 --enable-dp-attention --dp-size 2",
        ),
        ([], None),
    ],
)
def test_the_attention_layout_holds_the_flags_as_typed(tmp_path, launch, typed) -> None:
    from checker.cli.main import _subparser, build_parser
    from checker.cli.namespace import apply_launch_command, given_dests
    from checker.launch.merge import given_flags

    parser = build_parser()
    args = parser.parse_args(["check", *CHECKER])
    args.given = given_dests(_subparser(parser, "check"), list(CHECKER))
    args, args.launch = apply_launch_command(
        args,
        [*SERVE, "--model-path", _model(tmp_path), *launch],
        given=args.given,
    )
    assert given_flags(args).attention == typed
