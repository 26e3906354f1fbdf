"""What the user reads: text tables, the JSON document and report, JUnit, the step summary and the sweep
plot, written through the bounded, non-destructive writes of :mod:`checker.files`. Torch-free."""
