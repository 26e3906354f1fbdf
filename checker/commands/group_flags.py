"""The options of a command that runs over a process group (check, sweep), and what they give the
session: how a rank joins (``--backend``, ``--timeout-s``, ``--init-method``)."""

from __future__ import annotations

import argparse

from checker.commands.flag_types import init_method, timeout_seconds
from checker.commands.options import FlagGroup
from checker.distributed.launch_env import GroupOptions


def add_group_args(g: FlagGroup) -> None:
    """Options of any command that runs over a process group (check, sweep)."""
    g.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl with tensors on cuda:LOCAL_RANK when a GPU is present, else gloo",
    )
    g.add_argument(
        "--timeout-s",
        type=timeout_seconds,
        default=60.0,
        metavar="S",
        help="bound on init and on every collective; a lost rank ends the run after about "
        "this long with status infrastructure_failure (default 60)",
    )
    g.add_argument(
        "--init-method",
        type=init_method,
        metavar="URL",
        default=None,
        help="rendezvous without torchrun: file:///path/to/fresh/file (tests); default: "
        "torchrun's store from MASTER_ADDR/MASTER_PORT",
    )


def group_options(args: argparse.Namespace) -> GroupOptions:
    """What :func:`add_group_args` read, as the session takes it."""
    return GroupOptions(backend=args.backend, timeout_s=args.timeout_s, init_method=args.init_method)
