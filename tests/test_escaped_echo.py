"""Every text the checker echoes from outside is escaped by the one function that escapes
(``checker.core.errors.printable``) and cut like every other long value: a terminal escape, a carriage
return or a right-to-left override in a name can neither act on the terminal or the CI log nor split
or reorder the one line. What a user relies on: the line they read is the line the checker wrote.

The names come from where a user or a peer hands them over: a server log's file name (the post-flight's
table and its one error line), a rank's host name (``CHECKER_HOSTNAME`` or the machine's, carried over
the wire and the rendezvous store into rank 0's output and report), an unknown flag of any length, and
a ``--report`` the post-flight cannot read (nested past any report, too large, not an object).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rank_rows import world

from checker.core.errors import printable
from checker.distributed.launch_env import RankEnv
from checker.distributed.wire import decode_row, encode_row
from checker.outputs.report import one_line, to_junit, to_markdown, to_text
from checker.preflight.verdict import decide

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "examples" / "logs"
EVIL = "gpu\x1b]0;owned\x07\x1b[2J\x1b[31mred\rnode-9\u202e"
"""A name that would set the terminal's title, clear the screen, colour what follows, return to the
line's start (overwriting what came before) and reverse what follows, if echoed raw."""
RAW = ("\x1b", "\x07", "\r", "\u202e")


def _clean(text: str) -> None:
    for c in RAW:
        assert c not in text, (c, text[:400])


# -- the post-flight: a log's name ----------------------------------------------------------------------


def test_a_logs_name_is_escaped_in_the_postflight_table_and_its_error_line(cli, tmp_path):
    """The post-flight's table showed each rank's line as ``NAME:4`` with NAME raw, and a log it cannot
    read ended in one error line with NAME raw (a ``\\r`` in it split that line in two on a terminal)."""
    log = tmp_path / f"{EVIL}.log"
    shutil.copyfile(LOGS / "node0.log", log)
    res = cli(["postflight", "--report", str(LOGS / "preflight.json"), str(log)])
    assert res.rc == 2, res  # node 1's log is missing: exit 2, the table printed
    _clean(res.out + res.err)
    assert f"{printable(str(log))}:4" in res.out, res.out
    gone = tmp_path / f"{EVIL}-gone.log"
    res = cli(["postflight", "--report", str(LOGS / "preflight.json"), str(gone)])
    assert res.rc == 2
    _clean(res.out + res.err)
    (line,) = res.err.splitlines()
    assert printable(str(gone)) in line, line
    res = cli(["postflight", "--format", "json", str(log)])
    assert json.loads(res.out)["logs"][0]["path"] == str(log)  # the JSON keeps the name as given


# -- a host name from the wire and the store ------------------------------------------------------------


def test_a_peers_host_name_reaches_rank_0s_output_escaped():
    """Every rank's host name travels to rank 0 (the wire's host slot) and lands in its table, markdown,
    JUnit and root-cause line: escaped there like every other echoed input, whatever the peer sent."""
    rows = world(2)
    sent = [rows[0], replace(rows[1], host=EVIL, max_mamba_cache_size=70)]
    got = [decode_row(encode_row(r)) for r in sent]
    assert got[1].host == printable(EVIL.encode()[:64].decode(errors="replace"))
    verdict = decide(got, world_size=2)
    assert verdict.status == "divergent"
    for text in (
        to_text(verdict, summary="s", elapsed_s=1.0),
        to_markdown(verdict, summary="s"),
        to_junit(verdict, elapsed_s=1.0),
        one_line(verdict),
    ):
        _clean(text)


def test_a_ranks_own_host_name_is_escaped_where_it_is_read():
    env = RankEnv.from_environ({"CHECKER_HOSTNAME": EVIL, "RANK": "0", "WORLD_SIZE": "2"})
    _clean(env.host)
    assert env.host == printable(EVIL)


def test_a_host_name_read_from_the_rendezvous_store_is_escaped(tmp_path):
    """A lost rank is named with its host as the store holds it (``host/<rank>``)."""
    from torch.distributed import FileStore

    from checker.distributed import liveness

    store = FileStore(str(tmp_path / "store"), 1)
    liveness.join(store, 1, EVIL)  # a peer's own host, as it joined
    hosts = liveness.hosts(store, [1])
    assert hosts and all(h == printable(EVIL) for h in hosts.values()), hosts


# -- an unknown flag, cut -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["derive", "check", "postflight"])
def test_an_unknown_flag_of_any_length_is_cut_in_the_one_error_line(cli, command):
    """A 120,000-character unknown flag was echoed whole in the one error line; every other long value is
    cut. Now it is cut too, saying how long it was, and escaped."""
    flag = "--" + "x" * 120_000 + "\x1b[2J"
    res = cli([command, flag])
    assert res.rc == 2
    (line,) = res.err.splitlines()
    assert len(line) < 600 and "120,006 chars" in line, line[:400]
    _clean(line)


def test_a_long_invalid_choice_is_cut_too(cli):
    res = cli(["derive", "--format", "j" * 50_000])
    (line,) = res.err.splitlines()
    assert res.rc == 2 and len(line) < 600 and "50,002 chars)" in line, line[:400]  # as argparse quotes it


# -- a --report the post-flight cannot read -------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[" * 2000 + "]" * 2000, "nests deeper than"),
        (
            '{"command": "check", "ranks": ' + "[" * 200 + "]" * 200 + ', "world_size": 1}',
            "nests deeper than",
        ),
        ('{"a": ' * 3000 + "1" + "}" * 3000, "nests deeper than"),
        ("[1, 2]", "a list, not the preflight's JSON report"),
        ('"x"', "a string, not the preflight's JSON report"),
        ("1e999", "not the preflight's JSON report"),
        ('{"command": "check", "world_size": NaN, "ranks": []}', "not JSON"),
        ("\xff\xfe", "not UTF-8"),
    ],
    ids=["2000-deep", "200-deep-ranks", "3000-deep", "list", "string", "infinity", "nan", "binary"],
)
def test_an_unreadable_preflight_report_is_one_line_exit_2(cli, tmp_path, content, says):
    """`postflight --report` of a 2,000-deep nested JSON ended in a RecursionError traceback and exit 1
    (read as "divergent"). Any report it cannot read (depth, size, type) is one line, exit 2."""
    report = tmp_path / "preflight.json"
    report.write_bytes(content.encode("latin-1") if content.startswith("\xff") else content.encode())
    res = cli(["postflight", "--report", str(report), str(LOGS / "node0.log")])
    assert res.rc == 2, res
    assert "Traceback" not in res.err
    (line,) = res.err.splitlines()
    assert says in line, line
