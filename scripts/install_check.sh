#!/usr/bin/env bash
# Checks the installed library from outside Bazel (run by scripts/test.sh): installs into a
# temporary prefix with scripts/install.sh, then builds tests/install/consumer.c
#   1. with `pkg-config --cflags --libs orbitte` (shared: NEEDED liborbitte.so.<major>),
#   2. with `pkg-config --static` against liborbitte.a,
#   3. as a CMake project (find_package(orbitte), orbitte::orbitte and ::orbitte_static),
# and runs each: two engines over tcp, bytes compared. Exits non-zero on the first failure.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
for p in pkg-config cmake; do
    command -v "$p" >/dev/null || { echo "install_check: $p missing (scripts/deps.sh installs it)"; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
scripts/install.sh --prefix "$prefix" >/dev/null 2>"$work/install.log" ||
    { cat "$work/install.log"; echo "install_check: scripts/install.sh failed"; exit 1; }
major=$(sed -n 's/^#define OTE_VERSION_MAJOR \([0-9]*\)$/\1/p' engine/include/ote/ote.h)
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
run() { # name, binary
    echo "install_check: $1"
    LD_LIBRARY_PATH="$prefix/lib" timeout 120 "$2" || { echo "install_check: $1 failed"; exit 1; }
}
# 1. pkg-config, shared
cc -std=c11 -Wall -Wextra -Werror -o "$work/pc_shared" tests/install/consumer.c \
    $(pkg-config --cflags --libs orbitte)
readelf -d "$work/pc_shared" | grep -q "NEEDED.*\[liborbitte.so.$major\]" ||
    { echo "install_check: the pkg-config consumer does not need liborbitte.so.$major"; exit 1; }
run "pkg-config, shared" "$work/pc_shared"
# 2. pkg-config, static
cc -std=c11 -Wall -Wextra -Werror -o "$work/pc_static" tests/install/consumer.c \
    $(pkg-config --cflags orbitte) "$prefix/lib/liborbitte.a" $(pkg-config --static --libs-only-l orbitte | sed 's/-lorbitte//')
if readelf -d "$work/pc_static" | grep -q "liborbitte"; then
    echo "install_check: the static consumer still needs liborbitte.so"; exit 1
fi
run "pkg-config, static" "$work/pc_static"
# 3. CMake
cmake -S tests/install -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 &&
    cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 ||
    { cat "$work/cmake.log"; echo "install_check: the CMake consumer did not build"; exit 1; }
run "CMake, orbitte::orbitte" "$work/cmake/consumer_shared"
run "CMake, orbitte::orbitte_static" "$work/cmake/consumer_static"
echo "install_check: ok"
