"""Geometry and sizing: the model geometry, the state and KV pools each release sizes, the partition of
layers over stages, the budget, planning and the rank row."""
