"""The command line: the parser and entry point (:mod:`checker.cli.main`) and the flags every command
shares (:mod:`checker.commands.options`). Torch-free, so ``--help`` and input errors cost no torch import."""
