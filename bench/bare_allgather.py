"""The baseline of bench/preflight_bench.py: a torchrun job that only initialises gloo, all-gathers
one int64 tensor and exits. Anything the preflight costs beyond this is the checker's own overhead."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
out = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.tensor([dist.get_rank()], dtype=torch.int64))
dist.destroy_process_group()
