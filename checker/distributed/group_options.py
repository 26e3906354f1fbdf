"""How a rank joins the process group: backend, timeout, init method (torch-free).

Built once from the command line (``--backend``, ``--timeout-s``, ``--init-method``) by the command that
runs under torchrun; the session (:mod:`checker.distributed.session`) reads it, and the typed config
(:mod:`checker.config`) holds it. It lives here, beside the session, so the distributed layer imports
nothing above it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """How a rank joins the process group (check and sweep under torchrun)."""

    backend: str = "auto"
    timeout_s: float = 60.0
    init_method: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GroupOptions:
        return cls(backend=args.backend, timeout_s=args.timeout_s, init_method=args.init_method)
