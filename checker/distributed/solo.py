"""A world of one rank with no rendezvous to meet at: every gather is the rank's own values (torch-free).

A rank that only reports (its command line was refused: :func:`checker.distributed.exchange.run` with
``refused``) and runs alone needs no store and no process group: it gathers with itself. Without this it
would import torch (about 2.5 s on a loaded CPU node) to print one usage line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from checker.distributed.liveness import Heartbeat, Store

if TYPE_CHECKING:
    import torch


class SoloGroup:
    """The :class:`checker.distributed.group.Group` surface for a world of one: nothing to join, wait for
    or tear down."""

    store: Store | None = None
    liveness_store: Store | None = None
    heartbeat: Heartbeat | None = None
    device: torch.device | None = None

    def __init__(self, backend: str) -> None:
        self.backend = backend
        """As given: no backend is ever used."""

    def resolve(self) -> None:
        pass

    def join(self) -> None:
        pass

    def init(self) -> None:
        pass

    def gather_rows(self, values: Sequence[int]) -> list[list[int]]:
        return [[int(v) for v in values]]

    def all_gather_int64(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        import torch  # torch: only a payload gather, which a refused rank alone never reaches

        t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
        return t.to(device="cpu", dtype=torch.int64).reshape(1, -1)

    def shorten_store_timeout(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass
