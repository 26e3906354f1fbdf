#!/usr/bin/env bash
# Read the preflight's verdict from its JSON report: print the status, exit with the checker's own code
# (consistent 0, divergent 1, error 2, infrastructure_failure 3, model_drift 4).
#
#   launchers/torchrun.sh ... --report out/report.json || true   # torchrun exits 1 for any failing rank
#   launchers/read-verdict.sh out/report.json                    # the step's real verdict
#
# No report, or one that cannot be read, means the checker never reached a verdict (a node never joined
# the rendezvous, the launch failed): that is an infrastructure_failure too. Delete the report before
# each run so a stale one is never read.
set -uo pipefail
report="${1:?usage: read-verdict.sh REPORT.json}"
exec "${PYTHON:-python3}" - "$report" <<'PY'
import json
import sys

CODES = {"consistent": 0, "divergent": 1, "error": 2, "infrastructure_failure": 3, "model_drift": 4}
path = sys.argv[1]
try:
    with open(path) as f:
        status = json.load(f)["status"]
    code = CODES[status]
except (OSError, ValueError, KeyError, TypeError) as exc:
    print("infrastructure_failure")
    print(f"read-verdict: no verdict in {path} ({type(exc).__name__}: {exc}): the checker never "
          "finished; see the launcher's log (a node that never joined, a failed launch)", file=sys.stderr)
    sys.exit(3)
print(status)
sys.exit(code)
PY
