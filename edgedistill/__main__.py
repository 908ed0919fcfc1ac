"""`python -m edgedistill`: the `edgedistill` command (see `edgedistill.cli`)."""

import sys

from edgedistill.cli import main

sys.exit(main())
