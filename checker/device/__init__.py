"""Derivation and allocation on a torch device: the vectorised budget sweep (bit-identical to the scalar
core) and the real allocation of a stage's state pool (``--materialize``)."""
