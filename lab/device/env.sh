# Sourced by the device scripts (lab/device/*.sh) on a GPU machine, from the repository root: the packages
# its image lacks (Ray, Optuna, SQLAlchemy, ...: a site-packages tarball in .devdeps/site.tar.xz, e.g. from
# ../shared/tools/device-bundle), moetune and the lab, and the environment every sweep on a shared GPU needs.
# Needs OUT set.
if ! python3 -c 'import ray, optuna, sqlalchemy' 2>/dev/null; then
  site=$(mktemp -d) && tar xJf .devdeps/site.tar.xz -C "$site" && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-deps --no-build-isolation -e . -e lab >"$OUT/install.log" 2>&1 \
    || { cat "$OUT/install.log"; exit 1; }
fi
# Every runtime dependency the image lacks, checked up front: one missing from the bundle would otherwise
# fail each step of a run seconds in, with the machine held all the while.
python3 -c 'import alembic, optuna, platformdirs, ray, sqlalchemy' || {
  echo "env.sh: .devdeps lacks a dependency; rebuild it: ../shared/tools/device-bundle platformdirs" >&2
  exit 1
}
MOETUNE=(python3 -m moetune.cli)
export PYTHONUNBUFFERED=1
# Many worker processes share one GPU: no preallocation, and memory goes back to the driver when freed,
# so that the largest shapes' verification buffers of one worker never starve another. Kernel times are
# CUPTI times of the kernel alone, which the allocator does not touch.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
# Some container hosts report a small MemTotal that grows as memory is used: Ray's memory monitor would
# read that as pressure and kill workers, so it stays off here.
export RAY_memory_monitor_refresh_ms=0
source lab/device/timebox.sh
# Fold each SQLite database's write-ahead log into it, so that $OUT brings back one file per database.
merge_wal() {
  for db in "$1"/*.db; do
    [ -e "$db" ] || continue  # no database: the glob stays literal
    python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()" "$db"
    rm -f "$db-wal" "$db-shm"
  done
}
