#!/usr/bin/env bash
# Builds Viper (RelWithDebInfo, UCX and the Python package) in build/. Idempotent; quiet when there
# is nothing to do. Used by scripts/demo.sh and scripts/test.sh (run scripts/install-deps.sh first).
# Writes nothing outside build/: `import viper` from this build is
#   PYTHONPATH=$PWD/build/python /usr/bin/python3 ...      (what demo.sh, test.sh and ctest do)
# or, opt-in, VIPER_PTH=1 puts a viper-build.pth pointing at build/python into the user's site
# directory (python3 -m site --user-site; no sudo). To install instead: docs/INSTALL.md.
#
#   scripts/build.sh            VIPER_JOBS sets the build parallelism (default: number of cores)
#
# VIPER_BUILD_SANITIZED_TESTS=OFF (as scripts/test.sh's release stage sets it) leaves out the C++
# tests that the sanitizer builds run too; ON puts them back. Unset, build/ keeps what it had
# (ON in a new build/).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${VIPER_JOBS:-$(nproc)}

# -g1: line tables for profilers and backtraces without full debug info
# (tools/viper-bench/cmd_bench.cc: 12.2 s to compile instead of 17.3 s at -g).
cmake -S "$root" -B "$root/build" -G "$("$root/scripts/cmake-generator.sh" "$root/build")" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DVIPER_WITH_UCX=ON -DVIPER_WITH_PYTHON=ON ${VIPER_BUILD_SANITIZED_TESTS:+-DVIPER_BUILD_SANITIZED_TESTS=$VIPER_BUILD_SANITIZED_TESTS} >/dev/null
cmake --build "$root/build" -j"$jobs" | grep -vE '^\[ *[0-9]+(%|/[0-9]+)\]|^(Consolidate|Scanning|Built target|ninja: no work)' || true
# grep filters progress lines only; a failed build must still fail this script:
cmake --build "$root/build" -j"$jobs" >/dev/null

if [[ ${VIPER_PTH:-0} == 1 ]]; then
  site=$(/usr/bin/python3 -m site --user-site)
  mkdir -p "$site"
  if [[ ! -f "$site/viper-build.pth" || "$(cat "$site/viper-build.pth")" != "$root/build/python" ]]; then
    echo "$root/build/python" >"$site/viper-build.pth"
    echo "build.sh: import viper now resolves to $root/build/python ($site/viper-build.pth)"
  fi
fi
# Earlier versions of this script wrote /usr/local/lib/python3.*/dist-packages/viper-build.pth
# with sudo; say so while it points here (this script no longer writes or removes it).
for old in /usr/local/lib/python3*/dist-packages/viper-build.pth; do
  if [[ -f "$old" && "$(cat "$old")" == "$root/build/python" ]]; then
    echo "build.sh: $old (left by an older build.sh) still points at this build; remove it with: sudo rm $old" >&2
  fi
done
