#!/usr/bin/env bash
# Run the pp-capacity preflight on this node: one torchrun agent, NPROC_PER_NODE ranks.
#
#   # one node, 8 GPUs (pp 2 x tp 4):
#   NPROC_PER_NODE=8 launchers/torchrun.sh --budget-from-device --weights-gib 12 --report r.json \
#       -- python -m sglang.launch_server --model-path /models/Kimi-Linear-48B-A3B --pp-size 2 \
#       --tp-size 4 --mem-fraction-static 0.85 --host 0.0.0.0 --port 30000
#   # each of 2 nodes, 8 GPUs each (pp 2 x tp 8), node i of 0..1:
#   NNODES=2 NODE_RANK=$i RDZV_ENDPOINT=node0:29400 RDZV_ID=$CI_JOB_ID LOCAL_ADDR=$(hostname -i) \
#       launchers/torchrun.sh --budget-from-device --weights-gib 47 --report r.json \
#       -- python -m sglang.launch_server --model-path /models/Qwen3.5-397B-A17B --pp-size 2 \
#       --tp-size 8 --mem-fraction-static 0.85 --host 0.0.0.0 --port 30000
#
# Then, once the server started with that launch command is ready, hold its own log to the prediction
# (exit 0 consistent, 1 divergent, 2 error):
#     launchers/postflight.sh r.json server.log
#
# Every argument goes to the checker unchanged, `--` and the deployment's launch command after it
# included: the checker reads the sizing inputs (model, pp/tp/dp, page size, mem fraction, ...) from the
# command the server runs. Checker flags alone (--model-config M --tp-size 2 ...) work too. torchrun exits
# 1 for ANY failing worker: read the verdict from the report's "status" (launchers/read-verdict.sh), not
# from this script's exit code.
#
# The whole agent is bounded: GNU `timeout` sends torchrun SIGTERM after JOB_TIMEOUT_S and SIGKILL
# KILL_AFTER_S later, and this script then exits 124 (or 137). The checker bounds its own waits by
# --timeout-s, but nothing inside it can end a rank that is stopped (SIGSTOP, a hung driver) when no
# other rank on this node fails, nor an agent cut off from node 0's store (torchrun retries the store
# for up to read_timeout per call): without this bound such a job holds its CI runner forever.
set -euo pipefail

# --- knobs (environment), with defaults --------------------------------------------------------------
# Nodes in the job. 1: a single-node `--standalone` run (no endpoint, no id, nothing to collide with).
NNODES="${NNODES:-1}"
# Ranks on this node, normally its GPU count; the world is NNODES x NPROC_PER_NODE = pp x tp.
NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
# This node's index, 0..NNODES-1. Node 0 hosts the rendezvous store (is_host=1). torchrun's c10d
# rendezvous assigns global ranks itself, so rank 0 (the one that writes --report) may sit on any node.
NODE_RANK="${NODE_RANK:-0}"
# host:port of the rendezvous store on node 0, the same on every node (NNODES > 1 only).
RDZV_ENDPOINT="${RDZV_ENDPOINT:-}"
# Names this job in the store: the same on every node, different for every job (e.g. the CI job id).
RDZV_ID="${RDZV_ID:-pp-capacity-preflight}"
# This node's address as the other nodes reach it (an IP is safest). Unset, torchrun uses this machine's
# FQDN, which in containers and namespaces often resolves to localhost: remote ranks then dial themselves.
LOCAL_ADDR="${LOCAL_ADDR:-}"
# Process-group backend for the checker: auto (nccl when a GPU is present, else gloo), gloo or nccl.
BACKEND="${BACKEND:-auto}"
# Extra c10d rendezvous settings appended after is_host, e.g. "join_timeout=120,read_timeout=30": how
# long node 0 waits for a node that never arrives (torchrun's default join_timeout is 600 s).
RDZV_CONF="${RDZV_CONF:-}"
# Seconds after which the whole torchrun job on this node is stopped (SIGTERM to torchrun, which SIGTERMs
# its workers and SIGKILLs them after its shutdown timeout). Default: the rendezvous' join_timeout (from
# RDZV_CONF, else torchrun's 600 s; 0 for one node) + the checker's --timeout-s (its default 60 s when not
# given) + JOB_SLACK_S (90 s) for torch imports and worker start, the checker's own watchdog margin past
# --timeout-s (checker/commands/check.py) and torchrun's SIGTERM->SIGKILL of a failed node's workers (30 s).
JOB_TIMEOUT_S="${JOB_TIMEOUT_S:-}"

if [[ "$NNODES" == 1 ]]; then
    # c10d on localhost:0 with a random id: several jobs can share a host.
    launch=(--standalone)
else
    if [[ -z "$RDZV_ENDPOINT" ]]; then
        echo "torchrun.sh: NNODES=$NNODES needs RDZV_ENDPOINT=host:port of node 0" >&2
        exit 2
    fi
    # Explicit is_host: torchrun's guess compares hostnames, which containers and namespaces share, so
    # either no node or every node would try to host the store.
    is_host=$([[ "$NODE_RANK" == 0 ]] && echo 1 || echo 0)
    launch=(--nnodes "$NNODES" --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID"
            --rdzv-conf "is_host=$is_host${RDZV_CONF:+,$RDZV_CONF}")
    if [[ -n "$LOCAL_ADDR" ]]; then
        launch+=(--local-addr "$LOCAL_ADDR")
    fi
fi

# The preflight is the `check` command; accept it spelled out too.
if [[ "${1:-}" == check ]]; then
    shift
fi

# --- the job's time bound --------------------------------------------------------------------------------
JOB_SLACK_S=90
CHECKER_TIMEOUT_DEFAULT_S=60  # `checker check --timeout-s`'s default (checker/commands/check.py)
TORCHRUN_JOIN_DEFAULT_S=600   # c10d's join_timeout default (torch dynamic_rendezvous.py)

ceil_seconds() {  # a positive number (2.5, 1e2) -> whole seconds rounded up; anything else -> nothing
    awk -v t="$1" 'BEGIN { if (t !~ /^[0-9.eE+]+$/) exit; n = t + 0; c = int(n); if (c < n) c++;
                           if (c > 0 && c < 1e9) printf "%d", c }'
}

if [[ -z "$JOB_TIMEOUT_S" ]]; then
    # The checker's --timeout-s as argparse reads it: the last one given wins, "--timeout-s=X" too, and any
    # unambiguous abbreviation ("--ti" is the shortest: --tp-size and --token-capacity share "--t"). The
    # launch command after `--` is SGLang's, not the checker's: its flags are not read here.
    timeout_s=$CHECKER_TIMEOUT_DEFAULT_S
    args=("$@")
    for ((i = 0; i < ${#args[@]}; i++)); do
        arg="${args[i]}"
        [[ "$arg" == -- ]] && break
        name="${arg%%=*}"
        if [[ ${#name} -ge 4 && "--timeout-s" == "$name"* ]]; then
            if [[ "$arg" == *=* ]]; then value="${arg#*=}"; else value="${args[i + 1]:-}"; fi
            # A value the checker rejects (it exits 2 at once) keeps the default bound.
            timeout_s="$(ceil_seconds "$value")"
            timeout_s="${timeout_s:-$CHECKER_TIMEOUT_DEFAULT_S}"
        fi
    done
    join_s=0
    if [[ "$NNODES" != 1 ]]; then
        join_s=$TORCHRUN_JOIN_DEFAULT_S
        if [[ ",$RDZV_CONF," =~ ,join_timeout=([0-9]{1,9}), ]]; then
            join_s=$((10#${BASH_REMATCH[1]}))
        fi
    fi
    JOB_TIMEOUT_S=$((join_s + timeout_s + JOB_SLACK_S))
elif ! [[ "$JOB_TIMEOUT_S" =~ ^[1-9][0-9]{0,8}$ ]]; then
    echo "torchrun.sh: JOB_TIMEOUT_S='$JOB_TIMEOUT_S' must be a whole number of seconds above 0" >&2
    exit 2
fi
if ! command -v timeout >/dev/null 2>&1; then
    echo "torchrun.sh: needs \`timeout\` (GNU coreutils) to bound the job; install coreutils" >&2
    exit 2
fi
# torchrun waits its shutdown timeout (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30 s) between SIGTERM and
# SIGKILL of its workers: SIGKILL torchrun only after that, or a stopped worker (its own session, out of
# reach of any signal to torchrun) would outlive the job.
shutdown_s="${PET_SHUTDOWN_TIMEOUT:-${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-30}}"
[[ "$shutdown_s" =~ ^[1-9][0-9]{0,8}$|^0$ ]] || shutdown_s=30
KILL_AFTER_S=$((shutdown_s + 15))

# --foreground: signal torchrun alone (it stops its workers itself; they run in their own sessions), and
# keep Ctrl-C working when this is run from a terminal. --max-restarts 0: a restart only repeats a
# deterministic disagreement. --backend comes before "$@" so an explicit --backend argument still wins.
exec timeout --foreground --kill-after="$KILL_AFTER_S" "$JOB_TIMEOUT_S" \
    torchrun "${launch[@]}" --nproc-per-node "$NPROC_PER_NODE" --max-restarts 0 \
    -m checker check --backend "$BACKEND" "$@"
