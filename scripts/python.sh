#!/usr/bin/env bash
# Makes `import orbitte` (python/orbitte, the ctypes binding) work from this checkout on a
# fresh Debian 12 machine: installs the build dependencies (scripts/deps.sh), builds
# //engine:liborbitte.so with Bazel, copies it into the package directory
# python/orbitte/ (ignored by git), and prints the environment to use on stdout:
#
#   eval "$(scripts/python.sh)"                  # sets PYTHONPATH and ORBITTE_LIBRARY
#   python3 -c "import orbitte; print(orbitte.library_path)"
#
#   scripts/python.sh --install [DIR]            # or copy the package, library included,
#                                                # into DIR (default: python3's site dir,
#                                                # /usr/local/lib/python3.X/dist-packages)
#
# Everything but the two export lines goes to stderr. Nothing is compiled at import time:
# the package is pure Python and loads the library with ctypes (see python/orbitte/_lib.py
# for the search order: ORBITTE_LIBRARY, the package directory, the tree's bazel-bin).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
scripts/deps.sh >&2
bazel build //engine:liborbitte.so //naming:liborbitte_naming.so >&2
install -m 0755 bazel-bin/engine/liborbitte.so python/orbitte/liborbitte.so
install -m 0755 bazel-bin/naming/liborbitte_naming.so python/orbitte/liborbitte_naming.so
if [ "${1:-}" = "--install" ]; then
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    dest=${2:-$site}
    mkdir -p "$dest"
    rm -rf "$dest/orbitte"
    cp -r python/orbitte "$dest/orbitte"
    rm -rf "$dest/orbitte/__pycache__"
    echo "orbitte installed in $dest/orbitte (with liborbitte.so)" >&2
    if [ "$dest" = "$site" ]; then echo "# nothing to export: $dest is on $PY's path"
    else echo "export PYTHONPATH=$dest\${PYTHONPATH:+:\$PYTHONPATH}"; fi
    exit 0
fi
echo "export PYTHONPATH=$ROOT/python\${PYTHONPATH:+:\$PYTHONPATH}"
echo "export ORBITTE_LIBRARY=$ROOT/python/orbitte/liborbitte.so"
