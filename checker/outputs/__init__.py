"""What the user reads: text tables, the JSON document and report, JUnit, the step summary and the sweep
plot, and the bounded, non-destructive writes that put them on disk. Torch-free."""
