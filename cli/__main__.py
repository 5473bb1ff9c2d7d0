"""`python -m moetune.cli`: the same as the `moetune` console script."""

from moetune.cli import main

main()
