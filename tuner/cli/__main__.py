"""`python -m moetune.tuner.cli`: the same as the `moetune` console script."""

from moetune.tuner.cli import main

main()
