"""Backends: each sub-package is one backend exposing `BACKEND` (moetune.kernels.backend.Backend).

The registry lists the folders here and nothing else, so code beside the dispatch core (the MoE layer,
op specs) is never mistaken for a backend.
"""
