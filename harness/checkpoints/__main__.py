"""``python -m harness.checkpoints DIR``: the same as ``nemotron-vl-checkpoint DIR``."""

import sys

from harness.checkpoints.cli import main

sys.exit(main())
