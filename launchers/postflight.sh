#!/usr/bin/env bash
# The post-flight: once the server reports ready, hold its own log to the preflight's prediction.
#
#   launchers/postflight.sh out/report.json out/server.log           # the server is ready already
#   READY_URL=http://127.0.0.1:30000/health SERVER_PID=$server \
#       launchers/postflight.sh out/report.json out/server.log        # wait for it first
#   launchers/postflight.sh out/report.json node0.log node1.log       # one log per node (or one combined)
#
# Arguments: the preflight's JSON report (launchers/torchrun.sh ... --report), then the server's logs
# (every node's; - reads standard input). The verdict is `python -m checker postflight`'s: it prints
# what every rank logged against what the preflight predicted for it and exits 0 consistent, 1 divergent
# (the rank, its host, the value predicted and logged, the most likely cause), 2 error (a log or rank
# missing, an input unreadable). Its JSON report and JUnit file go to OUT_DIR (postflight.json,
# postflight.xml; default: the preflight report's directory), and a markdown verdict to
# $GITHUB_STEP_SUMMARY where set.
#
# Ready: with READY_URL set, it first waits until that URL answers (curl, each try bounded by 5 s) at most
# READY_TIMEOUT_S (900); a SERVER_PID that exits first ends the wait at once. A server that never became
# ready: infrastructure_failure, exit 3, with one line saying so (its log is then not a finished start).
# Unset READY_URL: the caller waited (its own health check).
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: postflight.sh PREFLIGHT_REPORT.json SERVER_LOG [SERVER_LOG ...]" >&2
    exit 2
fi
report="$1"
shift
python="${PYTHON:-python3}"
READY_URL="${READY_URL:-}"
READY_TIMEOUT_S="${READY_TIMEOUT_S:-900}"
SERVER_PID="${SERVER_PID:-}"
OUT_DIR="${OUT_DIR:-$(dirname -- "$report")}"

if ! [[ "$READY_TIMEOUT_S" =~ ^[1-9][0-9]{0,8}$ ]]; then
    echo "postflight.sh: READY_TIMEOUT_S='$READY_TIMEOUT_S' must be a whole number of seconds above 0" >&2
    exit 2
fi
if [[ -n "$READY_URL" ]]; then
    deadline=$((SECONDS + READY_TIMEOUT_S))
    until curl -sf --max-time 5 -o /dev/null "$READY_URL"; do
        if [[ -n "$SERVER_PID" ]] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "infrastructure_failure"
            echo "postflight.sh: the server (pid $SERVER_PID) exited before $READY_URL answered; see its log" >&2
            exit 3
        fi
        if ((SECONDS >= deadline)); then
            echo "infrastructure_failure"
            echo "postflight.sh: $READY_URL did not answer within $READY_TIMEOUT_S s (READY_TIMEOUT_S)" >&2
            exit 3
        fi
        sleep 2
    done
fi
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR/postflight.json" "$OUT_DIR/postflight.xml"  # a stale verdict must never be read
exec "$python" -m checker postflight --report "$report" --postflight-report "$OUT_DIR/postflight.json" \
    --junit "$OUT_DIR/postflight.xml" "$@"
