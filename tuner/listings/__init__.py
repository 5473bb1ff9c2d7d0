"""Rows of the database as plain JSON values: what `moetune best|sweeps|trials|misses --json` print and
what the service's API answers, one module per kind of row, so the two never drift apart."""
