#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs, for a GPU machine that has none of this project's Debian
# libraries: OUT/bin (viper, viper-bench, viper_gpu_peer, viper_gpu_subscriber, gpu_test, gpu_node_test), OUT/lib (every shared library they load,
# found by ldd, but the C and C++ runtimes), OUT/ucx (UCX's transport modules, which UCX opens
# itself), OUT/run (sets LD_LIBRARY_PATH and UCX_MODULE_DIR, then runs a program of OUT/bin),
# OUT/gpu-check.sh, OUT/hosts.sh (for the host-to-host bench) and OUT/tools (ip and sysctl, for hosts.sh where that machine lacks them), OUT/gpu_torch_baseline.py, OUT/gpu_cases.py, and OUT/python with
# OUT/gpu-python-build.sh (the Python package's sources, built there for that machine's python3 by
# gpu-check.sh). Then, there: `bash OUT/gpu-check.sh OUT`.
#
#   scripts/gpu-pack.sh OUT [BUILD]       BUILD defaults to ./build (after scripts/build.sh)
set -euo pipefail
out=${1:?usage: gpu-pack.sh OUT [BUILD]}
build=${2:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out"; mkdir -p "$out/bin" "$out/lib" "$out/ucx"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s)'
deps() {  # deps FILE [DIR]: copies the shared libraries FILE loads into DIR (default OUT/lib)
  local dir=${2:-$out/lib}
  ldd "$1" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    [ -e "$dir/$name" ] || { cp -L "$path" "$dir/$name"; deps "$path" "$dir"; }
  done
}
for p in "$build/bin/viper" "$build/bin/viper-bench" "$build/bin/viper_gpu_peer" "$build/bin/viper_gpu_subscriber" \
         "$build/bin/viper_wire_baseline" "$build/tests/gpu/gpu_test" "$build/tests/gpu/gpu_node_test"; do
  [ -x "$p" ] || { echo "gpu-pack: $p missing: build it first (cmake --build $build --target viper viper-bench viper_gpu_peer viper_gpu_subscriber viper_wire_baseline gpu_test gpu_node_test)" >&2; exit 1; }
  strip --strip-debug -o "$out/bin/$(basename "$p")" "$p"
  deps "$p"
done
# UCX's own benchmark, the host-to-host bench's baseline (found on PATH, which OUT/run extends).
if perftest=$(command -v ucx_perftest); then strip --strip-debug -o "$out/bin/ucx_perftest" "$perftest"; deps "$perftest"; fi
ucx=/usr/lib/x86_64-linux-gnu/ucx
if [ -d "$ucx" ]; then
  for m in "$ucx"/libuct_*.so.0 "$ucx"/libucx_*.so.0; do [ -e "$m" ] && { cp -L "$m" "$out/ucx/"; deps "$m"; }; done
fi
# ip and sysctl for hosts.sh (the host-to-host bench), used only where that machine has none: they
# come last on PATH, each a wrapper that finds its libraries in OUT/tools/lib (kept apart from
# OUT/lib, which every packed program loads first).
mkdir -p "$out/tools/bin" "$out/tools/lib" "$out/tools/real"
for t in ip sysctl; do
  p=$(command -v "$t" || true)
  [ -n "$p" ] || continue
  cp -L "$p" "$out/tools/real/$t"
  deps "$p" "$out/tools/lib"
  cat >"$out/tools/bin/$t" <<TOOL
#!/usr/bin/env bash
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)
LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/real/$t" "\$@"
TOOL
  chmod +x "$out/tools/bin/$t"
done
cat >"$out/run" <<'RUN'
#!/usr/bin/env bash
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" UCX_MODULE_DIR="$here/ucx" PATH="$here/bin:$PATH:$here/tools/bin"
prog=$1; shift
exec "$here/bin/$prog" "$@"
RUN
chmod +x "$out/run"
# The Python package, built there for that machine's python3 (scripts/gpu-python-build.sh): the
# bindings' sources and the headers they include, the static libraries they link and the shared
# libraries those need (into OUT/lib), and the link line in CMake's order.
py=$out/python
mkdir -p "$py/src" "$py/include/core" "$py/lib" "$py/viper"
cp "$root"/python/src/*.cc "$root"/python/src/*.h "$py/src/"
cp -r "$root/include/viper" "$build/generated/viper" "$py/include/"
cp "$root"/src/core/*.h "$py/include/core/"  # the bindings include some of the internal headers (memory, token_file)
cp -r /usr/include/fmt "$py/include/"
mkdir -p "$py/pybind11-include" && cp -r /usr/include/pybind11 "$py/pybind11-include/"  # used only if that machine's python has none
cp "$root"/python/viper/*.py "$root"/python/viper/*.pyi "$root"/python/viper/py.typed "$py/viper/" 2>/dev/null || true
link=$(awk '/^build python\/viper\/_viper/ {f = 1} f && /^  LINK_LIBRARIES = / {sub(/^  LINK_LIBRARIES = /, ""); print; exit}' "$build/build.ninja")
[ -n "$link" ] || { echo "gpu-pack: no link line for the Python extension in $build/build.ninja (a Ninja build with the Python package)" >&2; exit 1; }
libs=()
for l in $link; do
  case $l in
    *.a) strip --strip-debug -o "$py/lib/$(basename "$l")" "$build/$l"; libs+=("@PY@/lib/$(basename "$l")") ;;
    /*.so*) soname=$(objdump -p "$l" | awk '$1 == "SONAME" {print $2}')
            [ -e "$out/lib/$soname" ] || { cp -L "$l" "$out/lib/$soname"; deps "$l"; }
            libs+=("@LIB@/$soname") ;;
    *) libs+=("$l") ;;
  esac
done
echo "${libs[*]}" >"$py/link-libraries"
cp "$root/scripts/gpu-check.sh" "$root/scripts/gpu-python-build.sh" "$root/scripts/hosts.sh" "$root/bench/gpu_torch_baseline.py" "$root/tests/python/gpu_cases.py" "$out/"
echo "gpu-pack: $(du -sh "$out" | cut -f1) in $out; run there: bash $out/gpu-check.sh $out"
