"""`python -m tierfeed` runs the CLI."""

import sys

from tierfeed.cli import main

sys.exit(main())
