#!/usr/bin/env bash
# Builds Viper (RelWithDebInfo, UCX and the Python package) in build/ and makes `import viper`
# work under /usr/bin/python3: a viper-build.pth in Debian's site directory for local packages
# (/usr/local/lib/python3.11/dist-packages) points at build/python. Idempotent; quiet when there
# is nothing to do. Used by scripts/demo.sh and scripts/test.sh (run scripts/install-deps.sh first).
#
#   scripts/build.sh            VIPER_JOBS sets the build parallelism (default: number of cores)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${VIPER_JOBS:-$(nproc)}

# -g1: line tables for profilers and backtraces without full debug info (node_cmd_bench.cc: 12.2 s
# to compile instead of 17.3 s at -g).
cmake -S "$root" -B "$root/build" -G "$("$root/scripts/cmake-generator.sh" "$root/build")" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DVIPER_WITH_UCX=ON -DVIPER_WITH_PYTHON=ON >/dev/null
cmake --build "$root/build" -j"$jobs" | grep -vE '^\[ *[0-9]+(%|/[0-9]+)\]|^(Consolidate|Scanning|Built target|ninja: no work)' || true
# grep filters progress lines only; a failed build must still fail this script:
cmake --build "$root/build" -j"$jobs" >/dev/null

site=$(/usr/bin/python3 -c 'import site, sys; print(next(p for p in site.getsitepackages() if p.startswith("/usr/local")))')
pth="$site/viper-build.pth"
if [[ ! -f "$pth" || "$(cat "$pth")" != "$root/build/python" ]]; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO mkdir -p "$site"
  echo "$root/build/python" | $SUDO tee "$pth" >/dev/null
  echo "build.sh: import viper now resolves to $root/build/python ($pth)"
fi
