"""The preflight's own pieces: one rank's local derivation of its row (the row itself is
:mod:`checker.core.sizing.row`), the pipeline's tiling, and the verdict every rank decides from the gathered
rows.
Torch-free but for the on-device re-derivation."""
