"""checker.loading: a rank's torch import runs without the cyclic collector, which is on again after."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import gc, json, sys
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
from checker.loading import load_torch
load_torch()
during = len(collections)
load_torch()  # a second call: torch is loaded, nothing to do
frozen = gc.get_freeze_count()
gc.collect()
loaded = "torch.distributed" in sys.modules
print(json.dumps({"during": during, "enabled": gc.isenabled(), "frozen": frozen,
                  "after": len(collections) - during, "torch": loaded}))
"""


def test_torch_loads_without_collections_and_the_collector_is_on_after() -> None:
    """Each full collection while torch loads walks every object it has loaded so far (280-510 ms a
    rank under torchrun, bench/preflight_bench.py): none runs during the import, the loaded objects are
    frozen out of later ones, and the collector is on again for what the run allocates."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
    )
    got = json.loads(proc.stdout)
    assert got["torch"] and got["enabled"], got
    assert got["during"] == 0, got
    assert got["frozen"] > 100_000, got  # torch's objects, out of every later collection
    assert got["after"] >= 1, got  # gc.collect() ran: the collector works as before
