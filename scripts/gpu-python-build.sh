#!/usr/bin/env bash
# Builds the `viper` Python package for the python3 of a GPU machine from what scripts/gpu-pack.sh
# packed in PACK/python: the bindings' sources, the headers they include, the project's static
# libraries built here (position-independent) and the link line of the extension. The GPU machine
# has its own Python (3.12 where this is written) with pybind11 and torch, but none of this
# project's Debian libraries: those are PACK/lib, found through the extension's RPATH (old-style, which also
# serves the libraries those load: libucp loads libuct, and the machine may have a UCX of its own).
#
#   gpu-python-build.sh PACK [SITE]     SITE defaults to PACK/python-site; then PYTHONPATH=SITE
#
# PYTHON (default python3) picks the interpreter; PYBIND11_INCLUDE the pybind11 headers (default:
# the interpreter's pybind11 package, else the Debian headers packed beside the sources); CXX the
# compiler (default c++). UCX opens its transport modules from UCX_MODULE_DIR=PACK/ucx at run time.
set -euo pipefail
pack=$(cd "${1:?usage: gpu-python-build.sh PACK [SITE]}" && pwd)
site=${2:-$pack/python-site}
py=${PYTHON:-python3}
src=$pack/python
cxx=${CXX:-c++}
[ -f "$src/link-libraries" ] || { echo "gpu-python-build: $src/link-libraries missing: pack with scripts/gpu-pack.sh" >&2; exit 1; }
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
pybind=${PYBIND11_INCLUDE:-$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null || echo "$src/pybind11-include")}
[ -f "$pyinc/Python.h" ] || { echo "gpu-python-build: no Python.h in $pyinc (the interpreter's headers)" >&2; exit 1; }
[ -f "$pybind/pybind11/pybind11.h" ] || { echo "gpu-python-build: no pybind11 headers in $pybind" >&2; exit 1; }
echo "gpu-python-build: $("$py" --version 2>&1) ($pyinc), pybind11 from $pybind, $("$cxx" --version | head -1)"

rm -rf "$site/viper" "$site/obj"
mkdir -p "$site/viper" "$site/obj"
flags=(-O2 -DNDEBUG -fPIC -fvisibility=hidden -std=c++20 -DVIPER_LOG_WITH_FMT -I"$src/include" -I"$src/src"
       -isystem "$pybind" -isystem "$pyinc")
pids=()
for f in "$src"/src/*.cc; do
  "$cxx" "${flags[@]}" -c "$f" -o "$site/obj/$(basename "$f" .cc).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
# link-libraries: the extension's libraries in CMake's order; @PY@ is PACK/python, @LIB@ PACK/lib.
read -r -a libs <<<"$(sed -e "s#@PY@#$src#g" -e "s#@LIB@#$pack/lib#g" "$src/link-libraries")"
"$cxx" -shared -o "$site/viper/_viper$suffix" "$site"/obj/*.o "${libs[@]}" -L"$pack/lib" -Wl,--disable-new-dtags,-rpath,"$pack/lib"
cp "$src"/viper/* "$site/viper/"
rm -rf "$site/obj"
LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" UCX_MODULE_DIR="$pack/ucx" PYTHONPATH="$site" "$py" -c 'import viper, sys; print("gpu-python-build: import viper", viper.__version__ if hasattr(viper, "__version__") else "", "from", viper.__file__)'
