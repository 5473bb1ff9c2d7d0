# Sourced by scripts/test.sh and lab/test.sh. The tests compile the same XLA programs in many processes
# (each xdist worker, the CLI subprocesses and Ray workers they start, the next tier, the next run): jax's
# persistent compilation cache, shared by all of them, compiles each once. A hit is the executable a
# compile would give, so no test checks less. Only programs that take 0.3 s or more to compile are kept
# (the interpreted kernels, the models' steps); MAX_SIZE turns on the cache's file locks and eviction.
# Set JAX_COMPILATION_CACHE_DIR to use another folder.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-${TMPDIR:-/tmp}/moetune-tests-xla-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0.3}
export JAX_COMPILATION_CACHE_MAX_SIZE=${JAX_COMPILATION_CACHE_MAX_SIZE:-$((2 << 30))}
