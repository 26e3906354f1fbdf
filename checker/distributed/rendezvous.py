"""Where ranks meet without torchrun: the ``--init-method`` URLs the checker accepts (torch-free).

Checked once, where the flag is read (``checker.commands.flag_types.init_method``), before anything waits: a
FileStore on a missing directory retries forever while holding the GIL, so no timeout could end it.
"""

from __future__ import annotations

import os


def init_method_problem(url: str) -> str | None:
    """Why ``url`` cannot be used (one phrase, without the flag's name), or None when it can:
    ``file:///path`` (a fresh file in an existing directory) or ``env://`` (MASTER_ADDR/PORT)."""
    if url.startswith("file://"):
        path = url.removeprefix("file://")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            return f"{url}: directory {parent!r} does not exist"
        if os.path.isdir(path):
            return f"{url} is a directory; name a fresh file path"
        return None
    if url != "env://":
        return f"{url!r} is not supported; use file:///path or env://"
    return None
