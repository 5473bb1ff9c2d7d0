"""The benchmark model: a Mixtral-style decoder on moetune's MoE layer, and its decode kernels."""
