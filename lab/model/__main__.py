"""`python3 -m moetune_lab.model ...`: see cli.py."""

import sys

from moetune_lab.model.cli import main

sys.exit(main(sys.argv[1:]))
