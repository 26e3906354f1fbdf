"""What a single-process command (derive, plan) prints on stdout: its JSON document or its text lines.

Only the one asked for is built: a rendering may compute things (the slots per request, the installed
release) that the other never needs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from checker.config import OutputOptions


def show(output: OutputOptions, doc: Callable[[], dict[str, object]], lines: Callable[[], list[str]]) -> None:
    """``--format json``: the document, indented; else the lines."""
    if output.format == "json":
        json.dump(doc(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for line in lines():
        print(line)
