"""One file per schema revision, named after the moetune release that introduced it (v0.1.0.a, ...)."""
