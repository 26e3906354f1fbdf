#!/usr/bin/env bash
# Run the pp-capacity preflight on this node: one torchrun agent, NPROC_PER_NODE ranks.
#
#   one node:   NPROC_PER_NODE=8 launchers/torchrun.sh --model-config config.json --tp-size 2 --report r.json
#   each node:  NNODES=2 NODE_RANK=$i RDZV_ENDPOINT=node0:29400 RDZV_ID=$CI_JOB_ID LOCAL_ADDR=$(hostname -i) \
#                 launchers/torchrun.sh --model-config config.json --tp-size 2 --report r.json
#
# Every argument goes to the checker. torchrun exits 1 for ANY failing worker: read the verdict from the
# report's "status" (launchers/read-verdict.sh), not from this script's exit code.
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
# --max-restarts 0: a restart only repeats a deterministic disagreement. --backend comes before "$@" so
# an explicit --backend argument still wins.
exec torchrun "${launch[@]}" --nproc-per-node "$NPROC_PER_NODE" --max-restarts 0 \
    -m checker check --backend "$BACKEND" "$@"
