"""The deployment's SGLang launch command: each release's flag table (:mod:`~checker.launch.flags`), the
parser that reads a command as that release would (:mod:`~checker.launch.command`), and its merge with the
checker's own flags (:mod:`~checker.launch.merge`). Torch-free."""
