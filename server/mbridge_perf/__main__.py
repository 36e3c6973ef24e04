"""`python -m mbridge_perf` is the `mbridge-perf` command."""

import sys

from mbridge_perf.cli import main

sys.exit(main())
