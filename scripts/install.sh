#!/usr/bin/env bash
# Installs OrbitTE for C and C++ users outside Bazel:
#
#   scripts/install.sh --prefix DIR        (default /usr/local)
#
#   DIR/include/ote/ote.h, DIR/include/ote/status.h, DIR/include/ote/log.h    the public API
#   DIR/lib/liborbitte.so.X.Y.Z (+ .so.X, .so links)    the shared library (SONAME .so.X)
#   DIR/lib/liborbitte.a                                the same objects, static
#   DIR/lib/pkgconfig/orbitte.pc                        pkg-config --cflags --libs orbitte
#   DIR/lib/cmake/orbitte/orbitteConfig*.cmake          find_package(orbitte): orbitte::orbitte
#                                                       (shared), orbitte::orbitte_static
#
# Builds //engine:liborbitte.so first (installing the build dependencies with
# scripts/deps.sh). The static archive holds every object the shared library is linked
# from (read from Bazel's link parameters); a static user also links hwloc, libsodium,
# liburing and -ldl -pthread (pkg-config --static and the CMake target say so). The version comes from
# OTE_VERSION_* of <ote/ote.h>.
set -eu
cd "$(dirname "$0")/.."
PREFIX=/usr/local
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#--prefix=}; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$PREFIX" in /*) ;; *) PREFIX="$(pwd)/$PREFIX" ;; esac
scripts/deps.sh >&2
bazel build //engine:liborbitte.so >&2
ver() { sed -n "s/^#define OTE_VERSION_$1 \([0-9][0-9]*\)$/\1/p" engine/include/ote/ote.h; }
MAJOR=$(ver MAJOR) MINOR=$(ver MINOR) PATCH=$(ver PATCH)
VERSION="$MAJOR.$MINOR.$PATCH"
[ -n "$MAJOR" ] && [ -n "$MINOR" ] && [ -n "$PATCH" ] || { echo "install.sh: no OTE_VERSION_* in ote.h" >&2; exit 1; }
soname=$(readelf -d bazel-bin/engine/liborbitte.so | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "liborbitte.so.$MAJOR" ] || { echo "install.sh: SONAME '$soname' is not liborbitte.so.$MAJOR" >&2; exit 1; }

install -d "$PREFIX/include/ote" "$PREFIX/lib/pkgconfig" "$PREFIX/lib/cmake/orbitte"
install -m 0644 engine/include/ote/ote.h base/include/ote/status.h base/include/ote/log.h \
    "$PREFIX/include/ote/"
install -m 0755 bazel-bin/engine/liborbitte.so "$PREFIX/lib/liborbitte.so.$VERSION"
ln -sfn "liborbitte.so.$VERSION" "$PREFIX/lib/liborbitte.so.$MAJOR"
ln -sfn "liborbitte.so.$MAJOR" "$PREFIX/lib/liborbitte.so"

# The static archive: the objects of the shared library's link line.
objs=()
while IFS= read -r line; do
    case "$line" in *.o) objs+=("$line") ;; esac
done < bazel-bin/engine/liborbitte.so-2.params
[ ${#objs[@]} -gt 0 ] || { echo "install.sh: no objects in the link parameters" >&2; exit 1; }
rm -f "$PREFIX/lib/liborbitte.a"
( cd "$(bazel info execution_root 2>/dev/null)" && ar rcs "$PREFIX/lib/liborbitte.a" "${objs[@]}" )

sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" packaging/orbitte.pc.in \
    > "$PREFIX/lib/pkgconfig/orbitte.pc"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@MAJOR@|$MAJOR|g" packaging/orbitteConfig.cmake.in \
    > "$PREFIX/lib/cmake/orbitte/orbitteConfig.cmake"
sed -e "s|@VERSION@|$VERSION|g" -e "s|@MAJOR@|$MAJOR|g" packaging/orbitteConfigVersion.cmake.in \
    > "$PREFIX/lib/cmake/orbitte/orbitteConfigVersion.cmake"
echo "orbitte $VERSION installed in $PREFIX (${#objs[@]} objects in liborbitte.a)" >&2
