"""One module per subcommand (``add_arguments(parser)`` and ``run(args) -> int``), the flags they share
(:mod:`checker.commands.options`) and the lifecycle every rank of check and sweep runs
(:mod:`checker.commands.lifecycle`). :mod:`checker.cli` reads them; nothing here imports the cli."""
