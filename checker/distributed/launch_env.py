"""What torchrun tells a worker, read once, and how the worker joins the process group (torch-free).

:class:`GroupOptions` lives here, beside :class:`RankEnv`, so the distributed layer imports nothing above
it (the typed config, :mod:`checker.config`, holds one) and start-up loads no module more for it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from checker.core.errors import printable


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    """GROUP_RANK: which torchrun agent (node) started this worker, as torchrun numbers the agents. Under
    c10d rendezvous that is the order the agents joined in (sorted by address), not the operator's."""
    host: str
    master_addr: str | None
    master_port: int | None
    use_agent_store: bool
    """torchrun's agent hosts the TCPStore (workers connect as clients)."""
    restart_count: int
    """Keys of an earlier attempt must not be read as this one's (the store's prefix)."""
    max_restarts: int
    operator_node_rank: int | None = None
    """NODE_RANK as the operator exported it on this node (the launchers' numbering: node 0 hosts the
    rendezvous store); None when unset or not a number."""

    @property
    def node_ranks(self) -> tuple[int, int]:
        """The first rank torchrun started on this node and how many it started: its agent numbers a
        node's workers ``RANK - LOCAL_RANK`` on, ``LOCAL_WORLD_SIZE`` of them. This rank alone when the
        numbers do not fit that (a launcher of its own)."""
        first = self.rank - self.local_rank
        if first < 0 or not 0 <= self.local_rank < self.local_world_size:
            return self.rank, 1
        return first, self.local_world_size

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        env = os.environ if env is None else env

        def num(name: str, default: int) -> int:
            try:
                return int(env.get(name, default))
            except ValueError:
                return default

        port = env.get("MASTER_PORT")
        return cls(
            rank=num("RANK", 0),
            world_size=num("WORLD_SIZE", 1),
            local_rank=num("LOCAL_RANK", 0),
            local_world_size=num("LOCAL_WORLD_SIZE", 1),
            node_rank=num("GROUP_RANK", 0),
            # Shown in every rank's lines and sent to rank 0: escaped (a terminal escape in a name
            # must not act on the CI log).
            host=printable(env.get("CHECKER_HOSTNAME") or socket.gethostname()),
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(port) if port and port.isdigit() else None,
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            restart_count=num("TORCHELASTIC_RESTART_COUNT", 0),
            max_restarts=num("TORCHELASTIC_MAX_RESTARTS", 0),
            operator_node_rank=num("NODE_RANK", -1) if env.get("NODE_RANK", "").strip().isdigit() else None,
        )


@dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """How a rank joins the process group (check and sweep under torchrun): ``--backend``,
    ``--timeout-s``, ``--init-method``, built once from the command line; the session reads it."""

    backend: str = "auto"
    timeout_s: float = 60.0
    init_method: str | None = None
