"""Weights and checkpoints: the parameters each release's class holds per rank, the checkpoint reader
and its names, where a rank's weights figure comes from, the hub cache."""
