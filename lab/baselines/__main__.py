"""`python3 -m moetune_lab.baselines ...`: see cli.py."""

import sys

from moetune_lab.baselines.cli import main

sys.exit(main(sys.argv[1:]))
