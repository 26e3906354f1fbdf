"""The preflight's own pieces: one rank's row (what it derived, from what), its local derivation, and the
verdict every rank decides from the gathered rows. Torch-free but for the on-device re-derivation."""
