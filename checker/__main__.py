"""``python -m checker`` and ``torchrun -m checker``."""

import sys

# First thing, before the imports below: under torchrun a SIGTERM from the agent is caught from
# here on and handed to the run (checker.distributed.sigterm), so a rank told to stop while it starts
# still says it is leaving and is never taken for the rank that failed.
from checker.distributed.sigterm import catch_early

catch_early()

from checker.cli.main import main  # noqa: E402 (after the signal is caught)

if __name__ == "__main__":
    sys.exit(main())
