"""The command line: the parser and entry point (:mod:`checker.cli.main`) and what a rank refused at parse
time still reads of its flags (:mod:`checker.cli.refusal`). The top layer: it reads the commands and the
flags they share from :mod:`checker.commands` (``commands.options``, ``commands.flag_types``), and
nothing imports it.
Torch-free, so ``--help`` and input errors cost no torch import."""
