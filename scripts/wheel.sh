#!/usr/bin/env bash
# Builds the Python wheel: dist/orbitte-<version>-py3-none-linux_x86_64.whl, the binding
# (python/orbitte) with liborbitte.so inside. Offline: Debian's python3-build with
# --no-isolation, setuptools and wheel from Debian (scripts/deps.sh installs them).
#
#   scripts/wheel.sh                    # then: pip install --no-index dist/orbitte-*.whl
#
# The tag is honest about what it needs: Linux x86-64 with glibc >= 2.34 (the newest
# symbol version liborbitte.so uses; checked below), libhwloc15, libsodium23 and liburing2
# (Debian 12 names); libibverbs and a CUDA driver are looked for at run time. It is not a manylinux
# wheel: auditwheel is not in Debian's archive, so the libraries are not bundled.
set -eu
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
scripts/deps.sh >&2
bazel build //engine:liborbitte.so >&2
install -m 0755 bazel-bin/engine/liborbitte.so python/orbitte/liborbitte.so
glibc=$(objdump -T python/orbitte/liborbitte.so | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)
echo "wheel: liborbitte.so needs $glibc, $(readelf -d python/orbitte/liborbitte.so |
    sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')" >&2
rm -rf python/build python/orbitte.egg-info
mkdir -p dist
"$PY" -m build --wheel --no-isolation --outdir dist python >&2
rm -rf python/build python/orbitte.egg-info
ls dist/orbitte-*.whl
