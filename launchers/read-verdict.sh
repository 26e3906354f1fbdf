#!/usr/bin/env bash
# Read the preflight's verdict from its JSON report: print the status, exit with the checker's own code
# (consistent 0, divergent 1, error 2, infrastructure_failure 3, model_drift 4; the table is
# checker/status.py's EXIT_CODES, and tests/test_launchers.py holds the two equal). For any status but
# consistent, one more line on stderr says why, from the report: its root causes (divergent), its errors
# naming each failing rank and host (error), what was lost and where (infrastructure_failure). stdout
# stays the status alone, so `status=$(launchers/read-verdict.sh r.json)` keeps working.
#
#   launchers/torchrun.sh --budget-from-device --weights-gib 12 --report out/report.json \
#       -- python -m sglang.launch_server --model-path /models/Kimi-Linear-48B-A3B --pp-size 2 --tp-size 4 \
#          --mem-fraction-static 0.85 || true
#   launchers/read-verdict.sh out/report.json   # the step's real verdict (torchrun exits 1 for any failure)
#
# No report, or one that cannot be trusted, means the checker never reached a verdict (a node never
# joined the rendezvous, the launch failed, the job was cut off mid-write): infrastructure_failure, exit 3,
# with one line on stderr saying why. Untrusted: not a regular file, over 64 MiB, not JSON, nested too
# deep to parse, not an object, a status outside the table, or an `exit_code` that is not the status's
# code. Exit 0 only for status "consistent" with exit_code 0. A run that cannot write its report removes
# the previous run's (or, where it cannot, empties it), so a stale verdict is not read as this run's;
# a run killed before it writes anything cannot, so still delete the report before each run. No argument
# (or more than one): a usage line and exit 2.
set -uo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: read-verdict.sh REPORT.json (prints the report's status, exits with its code)" >&2
    exit 2
fi
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "infrastructure_failure"
    echo "read-verdict: no Python interpreter '$python' to read $1 (set PYTHON)" >&2
    exit 3
fi
exec "$python" - "$1" <<'PY'
import json
import os
import stat
import sys

# checker/status.py's EXIT_CODES (a test runs this script once per status and compares).
CODES = {"consistent": 0, "divergent": 1, "error": 2, "infrastructure_failure": 3, "model_drift": 4}
INFRA = "infrastructure_failure"
EXIT_INFRA = CODES[INFRA]
MAX_BYTES = 64 * 1024 * 1024
"""A real report takes about 2.6 KB per rank (wire schema 12, the KV pool's fields added: a 16,384-rank
report is 42.6 MB; about 25,000 ranks fit); anything larger is not one, and parsing it could exhaust
memory."""
path = sys.argv[1]


def untrusted(why: str) -> None:
    print(INFRA)
    line = " ".join(f"read-verdict: no trusted verdict in {path}: {why}".split())
    print(line, file=sys.stderr)
    sys.exit(EXIT_INFRA)


try:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        untrusted("not a regular file")  # a FIFO would block the open forever, a device never end
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
except OSError as exc:
    untrusted(
        f"{type(exc).__name__}: {exc.strerror or exc}; the checker never finished or could not write "
        "its report (it removes the previous run's then): see the launcher's log (a node that never "
        "joined, a failed launch, a job cut off by its time bound, a full disk)"
    )
if not data:
    untrusted(
        "empty: a run that could not write its report empties the previous run's where it cannot remove "
        "it; see the launcher's log"
    )
if len(data) > MAX_BYTES:
    untrusted(f"over {MAX_BYTES} bytes, too large for a report")
try:
    report = json.loads(data)
except RecursionError:
    untrusted("nested too deeply to be a report")
except MemoryError:
    untrusted("too large to parse")
except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
    untrusted(f"not JSON ({type(exc).__name__}: {exc}); a report cut off mid-write or another file")
if not isinstance(report, dict):
    untrusted(f"a JSON {type(report).__name__}, not an object")
status, code = report.get("status"), report.get("exit_code")
if not isinstance(status, str) or status not in CODES:
    untrusted(f"status {status!r:.80} is none of {', '.join(CODES)}")
if type(code) is not int or code != CODES[status]:  # noqa: E721 (true/1.0 are not exit codes)
    untrusted(f"status {status!r} but exit_code {code!r:.80} (expected {CODES[status]})")


def cause(report: dict) -> str:
    """Why the run did not pass, in one line, from the report's own words (check's and sweep's keys)."""

    def texts(key: str) -> list[str]:
        value = report.get(key)
        items = value if isinstance(value, list) else [value]
        return [str(v) for v in items if isinstance(v, (str, int, float)) and str(v)]

    if status == INFRA:
        parts = texts("infrastructure_detail")
        missing = [str(r) for r in report.get("missing_ranks") or [] if type(r) is int]  # noqa: E721
        if parts or missing:
            parts.append(f"missing ranks: {', '.join(missing) if missing else 'none identified'}")
        return "; ".join(parts)
    if status == "divergent":
        parts = texts("root_causes") or texts("divergent") or texts("failing_required")
        return "root cause: " + " | ".join(parts) if parts else ""
    return " | ".join(texts("errors") or texts("root_causes") or texts("warnings"))


print(status)
if status != "consistent":
    why = cause(report)
    if why:
        # One line, printable: a report is data, and its text must not drive the terminal.
        why = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in " ".join(why.split()))
        print(f"read-verdict: {status}: {why[:4000]}", file=sys.stderr)
sys.exit(code)
PY
