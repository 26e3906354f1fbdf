"""How long reading a 100-shard checkpoint's headers takes, and how much memory: the headers, not the data.

    python bench/checkpoint_headers_bench.py   # Qwen3.5-397B, Qwen3-Next-80B (bf16, FP8, CT), 100 shards

For each model it writes a sparse checkpoint of the real shapes (tests/checkpoints.py: real headers, the
data regions holes) over 100 shards with an index, then times, best of five, ``read_checkpoint`` (the
index, then each shard's 8-byte length and JSON header, parsed afresh each time: the process's parsed-
header cache is emptied before each run; "read again" is the same read with the cache kept, as ``derive
--sglang-version A,B`` reads it for its second release) and the whole weights figure of every rank of a
pp 4 x tp 8 layout (headers, shape check against config.json, the class's parameters per rank). Memory:
the peak of Python's own allocations during one read (``tracemalloc``), beside the size of the headers
read, and the logical size of the checkpoint it describes. Page cache: the files are freshly written, so
the headers are in memory; a cold read adds one small read per shard (the headers are contiguous at each
file's start).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from checker.core.weights import checkpoint  # noqa: E402
from checker.core.weights.checkpoint import read_checkpoint  # noqa: E402
from checker.core.weights.weights import WeightsLayout  # noqa: E402
from checker.families.rules import check_shapes, model_weights  # noqa: E402
from checker.families.weights_source import checkpoint_weights  # noqa: E402
from tests.checkpoints import (  # noqa: E402
    compressed_tensors,
    disk_bytes,
    fp8_tensors,
    model_dir,
    write_checkpoint,
)

MODELS = {
    "Qwen3.5-397B-A17B": REPO / "tests/fixtures/weights/qwen3_5_397b_a17b.json",
    "Qwen3-Next-80B-A3B": REPO / "tests/fixtures/qwen3_next_80b_a3b.json",
    "Qwen3-Next-80B-FP8": REPO / "tests/fixtures/weights/qwen3_next_fp8_block.json",
    "Qwen3-Next-80B-CT": REPO / "tests/fixtures/weights/qwen3_next_ct_fp8_channel.json",
}
SHARDS = 100
LAYOUTS = {
    "Qwen3.5-397B-A17B": WeightsLayout(pp_size=4, tp_size=8),
    "Qwen3-Next-80B-A3B": WeightsLayout(pp_size=1, tp_size=8),
    "Qwen3-Next-80B-FP8": WeightsLayout(pp_size=1, tp_size=8, ep_size=8),
    "Qwen3-Next-80B-CT": WeightsLayout(pp_size=1, tp_size=8),
}


def best_of(fn, repeat: int = 5, *, cold: bool = True) -> tuple[float, float]:
    """Best wall time and best CPU time of this process (the CPU time is what a loaded machine's other
    processes do not add to). ``cold``: each run parses the headers afresh (the process's parsed-header
    cache emptied first, as in a rank's one read); else the headers were read once before."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        if cold:
            checkpoint._PARSED.clear()
            checkpoint._parsed_bytes = 0
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def main() -> None:
    load = os.getloadavg()[0]
    print(
        f"{SHARDS} shards each; seconds, best of 5 (wall / CPU of this process); memory: tracemalloc peak "
        f"of one read; load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'model':20} {'tensors':>8} {'logical':>9} {'on disk':>8} {'headers':>8} "
        f"{'read':>13} {'+check+ranks':>13} {'read again':>13} {'peak mem':>9}"
    )
    for name, config_path in MODELS.items():
        with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
            config = json.loads(config_path.read_text())
            if "quantization_config" in config:  # FP8: float8 weights and their scale tensors
                d = Path(tmp) / "m"
                d.mkdir()
                (d / "config.json").write_text(config_path.read_text())
                ct = config["quantization_config"].get("quant_method") == "compressed-tensors"
                write_checkpoint(d, (compressed_tensors if ct else fp8_tensors)(config), shards=SHARDS)
            else:
                d = model_dir(Path(tmp) / "m", config_path, shards=SHARDS)
            layout = LAYOUTS[name]
            read_s = best_of(lambda d=d: read_checkpoint(d))
            again_s = best_of(lambda d=d: read_checkpoint(d), cold=False)

            def whole(d: Path = d, config: dict = config, layout: WeightsLayout = layout) -> None:
                if "quantization_config" in config:  # the reader's whole path: FP8 scale checks included
                    checkpoint_weights(d, layout, release="0.5.23", config=config)
                    return
                ckpt = read_checkpoint(d)
                check_shapes(ckpt, config)
                model_weights(config, layout, release="0.5.23")

            whole_s = best_of(whole)
            checkpoint._PARSED.clear()
            checkpoint._parsed_bytes = 0
            tracemalloc.start()
            ckpt = read_checkpoint(d)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            print(
                f"{name:20} {len(ckpt.tensors):>8,} {ckpt.total_bytes / 1e9:>7.1f}GB "
                f"{disk_bytes(d) / 2**20:>6.1f}MB {ckpt.header_bytes / 2**20:>6.1f}MB "
                f"{read_s[0]:>6.3f}/{read_s[1]:.3f} {whole_s[0]:>6.3f}/{whole_s[1]:.3f} "
                f"{again_s[0]:>6.3f}/{again_s[1]:.3f} "
                f"{peak / 2**20:>7.1f}MB"
            )


if __name__ == "__main__":
    main()
