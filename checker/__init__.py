"""Capacity checker for pipeline-parallel SGLang deployments of hybrid linear-attention models.

    python -m checker derive --model kimi-k3 --pp-size 8 --budget-gib 8     # one process, every stage
    torchrun --standalone --nproc-per-node 8 -m checker --budget-gib 8       # the preflight

The package keeps imports lazy: ``checker.core`` never imports torch.
"""

__version__ = "0.1.0"
