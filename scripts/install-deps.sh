#!/usr/bin/env bash
# Installs every Debian package Viper needs. Idempotent: when everything is already installed it
# prints nothing and touches no package index.
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake pkg-config git ninja-build lld
  googletest libgtest-dev libgmock-dev
  libucx-dev ucx-utils
  nlohmann-json3-dev libxxhash-dev libzstd-dev libssl-dev
  libhiredis-dev redis-server
  libcli11-dev libfmt-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest python3-venv python3-pip
  python3-setuptools python3-wheel  # `pip install --no-build-isolation .` (setup.py), offline
  clang libclang-rt-14-dev
  iproute2 iputils-ping procps psmisc
  libopenblas0-openmp  # examples/cl_demo: torch's matmuls on the reference BLAS are ~10x slower
  python3-matplotlib  # examples/cl_demo: the policy stage plots served loss over time (docs/DEMO.md)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# redis-server's package starts a system instance; Viper's tests start their own on other ports.
