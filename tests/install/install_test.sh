#!/usr/bin/env bash
# Installs this build tree into a temporary prefix and uses it as another project would:
#   1. every installed header compiles alone (its own translation unit, -I<prefix>/include only);
#   2. no installed header pulls in a private dependency (fmt, nlohmann_json, UCX, hiredis,
#      xxhash, zstd, OpenSSL): the compiler's dependency list of all of them together is checked;
#   3. a CMake project (tests/install/consumer: find_package(viper), viper::viper) configures,
#      builds and runs: it publishes a version and receives it through a subscriber;
#   4. the same program built with pkg-config (viper.pc) alone runs too;
#   5. the installed bin/viper runs.
#
#   tests/install/install_test.sh BUILD_DIR CXX_COMPILER
set -euo pipefail

build=$(cd "$1" && pwd)
cxx=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/viper-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
step() { echo "install_test: $*"; }

start=$SECONDS
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
step "installed into $prefix in $((SECONDS - start)) s: $(find "$prefix" -type f | wc -l) files"
for f in include/viper/log.h include/viper/version.h lib/cmake/viper/viperConfig.cmake lib/pkgconfig/viper.pc \
         lib/libviper_api.a lib/libviper_core.a bin/viper; do
  [[ -f "$prefix/$f" ]] || { echo "install_test: $f is not installed" >&2; exit 1; }
done
if [[ -e "$prefix/include/viper/internal" ]]; then
  echo "install_test: include/viper/internal is installed (in-tree headers only)" >&2
  exit 1
fi
unit=$prefix/share/viper/systemd/viper-serve.service
if ! grep -q "^ExecStart=$prefix/bin/viper serve " "$unit"; then
  echo "install_test: $unit does not start $prefix/bin/viper: $(grep '^ExecStart=' "$unit")" >&2
  exit 1
fi

# 1. Each header alone, two at a time.
start=$SECONDS
headers=("$prefix"/include/viper/*.h)
printf '%s\n' "${headers[@]}" | xargs -P 2 -I{} sh -c \
  'echo "#include <viper/$(basename "$1")>" | "$2" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I"$3" -x c++ - ||
     { echo "install_test: $(basename "$1") does not compile alone against the installed tree" >&2; exit 255; }' \
  _ {} "$cxx" "$prefix/include"
step "${#headers[@]} headers compile alone in $((SECONDS - start)) s"

# 2. What the headers include, all of them at once.
for h in "${headers[@]}"; do echo "#include <viper/$(basename "$h")>"; done >"$tmp/all.cc"
"$cxx" -std=c++20 -M -I"$prefix/include" "$tmp/all.cc" >"$tmp/all.deps"
if grep -E -o '[^ ]*(fmt/|nlohmann/|ucp/|ucs/|uct/|hiredis|xxhash|zstd|openssl/)[^ ]*' "$tmp/all.deps" | sort -u >"$tmp/leaks" &&
   [[ -s "$tmp/leaks" ]]; then
  echo "install_test: installed headers include private dependencies:" >&2
  cat "$tmp/leaks" >&2
  exit 1
fi
step "no private dependency among the $(tr ' ' '\n' <"$tmp/all.deps" | grep -c '\.h') headers they include"

# 3. find_package(viper) from a project outside the tree.
start=$SECONDS
cmake -S "$here/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" || { cat "$tmp/configure.log" >&2; exit 1; }
cmake --build "$tmp/consumer" >"$tmp/build.log" || { cat "$tmp/build.log" >&2; exit 1; }
out=$("$tmp/consumer/consumer")
step "find_package(viper) consumer built in $((SECONDS - start)) s and ran: $out"
[[ $out == ok* ]]

# 4. pkg-config.
start=$SECONDS
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pc_version=$(pkg-config --modversion viper)
# shellcheck disable=SC2046  # pkg-config's output is word lists
"$cxx" -std=c++20 -O1 "$here/consumer/main.cc" -o "$tmp/consumer_pc" $(pkg-config --cflags --libs viper)
out=$("$tmp/consumer_pc")
step "pkg-config consumer (viper.pc $pc_version) built in $((SECONDS - start)) s and ran: $out"
[[ $out == ok* ]]

# 5. The installed program.
"$prefix/bin/viper" --version
