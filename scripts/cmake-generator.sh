#!/usr/bin/env bash
# Prints the CMake generator for build directory DIR: the one it was configured with (CMake refuses
# to switch a configured directory), else Ninja when installed (scripts/install-deps.sh installs
# it; it starts a target's compiles before its dependencies are linked, which Make does not), else
# Unix Makefiles.
#
#   scripts/cmake-generator.sh DIR
set -euo pipefail
cache=${1:?usage: cmake-generator.sh BUILD_DIR}/CMakeCache.txt
if [[ -f $cache ]] && grep -q '^CMAKE_GENERATOR:INTERNAL=' "$cache"; then
  sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache"
elif command -v ninja >/dev/null; then
  echo Ninja
else
  echo "Unix Makefiles"
fi
