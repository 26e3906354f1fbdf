"""The capacity core and the CLI front end stay torch-free (docs/development.md, "Layout").

Every rank of the preflight and every ``derive`` run imports this code; a stray ``import torch`` would
cost a second per process and make ``--help`` and bad-input errors depend on a working torch install.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_core_options_and_cli_import_without_torch() -> None:
    """A torch import anywhere under these modules shows as 'torch' in sys.modules of a fresh process."""
    code = textwrap.dedent(
        """
        import sys
        import checker.core, checker.core.sizing.sizing, checker.core.sizing.models, checker.commands.options
        import checker.cli.main
        import checker.core.sizing.geometry, checker.core.sizing.partition, checker.core.errors
        leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("LEAKED" if leaked else "CLEAN", leaked[:5])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CLEAN"), f"torch imported by the core: {proc.stdout.strip()}"
