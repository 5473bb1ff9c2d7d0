#!/usr/bin/env bash
# Packs lab/device/maxtext-device-requirements.txt (MaxText and what it imports that the GPU machine's
# image lacks) into .mtdeps/site.tar.xz, about 25 MB: small enough to travel with the working tree.
# The default device bundle (../shared/tools/device-bundle: Ray, Optuna, SQLAlchemy) is not needed by
# bench_maxtext.py, and both together would pass the 64 MiB a device call carries.
#   bash lab/device/maxtext_bundle.sh      # from the repository root, on any machine with pip
set -euo pipefail
root=$(git rev-parse --show-toplevel)
out="$root/.mtdeps"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$tmp/whl" -r "$root/lab/device/maxtext-device-requirements.txt"
mkdir -p "$tmp/site"
for w in "$tmp"/whl/*.whl; do (cd "$tmp/site" && python3 -m zipfile -e "$w" .); done
# tokamax imports xprof (a large profiler) at import time for its own benchmarking helpers only.
mkdir -p "$tmp/site/xprof/cli"; : >"$tmp/site/xprof/__init__.py"; : >"$tmp/site/xprof/cli/__init__.py"
echo 'def get_kernel_stats_tool(*a, **k): raise RuntimeError("xprof is not installed here")' >"$tmp/site/xprof/cli/tools.py"
find "$tmp/site" -name '__pycache__' -prune -exec rm -rf {} +
find "$tmp/site" -name '*.so' -exec chmod +x {} +
mkdir -p "$out"
grep -qxF '/.mtdeps/' "$root/.git/info/exclude" 2>/dev/null || echo '/.mtdeps/' >>"$root/.git/info/exclude"
tar cf - -C "$tmp/site" . | xz -T0 -6 >"$out/site.tar.xz"
ls -la "$out/site.tar.xz"
