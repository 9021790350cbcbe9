#!/usr/bin/env bash
# Installs what OrbitTE needs to build and test on Debian 12, from Debian's archive only.
# Idempotent: does nothing when every package is already installed.
set -eu
PKGS=(
    bazel-bootstrap      # Bazel 4.2.3, the only Bazel that works offline here
    build-essential      # gcc, g++, make
    libibverbs-dev       # rdma-core verbs (the real RDMA provider)
    ibverbs-providers
    libhwloc-dev         # NUMA topology for CQ worker placement
    liburing-dev         # io_uring for file registrations (engine/file)
    libsodium-dev        # HMAC, hashes and random nonces of the cluster key's authentication
    uthash-dev           # hash tables and lists
    libcurl4-openssl-dev # //naming: etcd v3's JSON gateway over HTTP
    libhiredis-dev       # //naming: the Redis client
    libcjson-dev         # //naming: JSON of etcd's gateway
    etcd-server          # tests/naming: a real etcd on loopback
    redis-server         # tests/naming: a real Redis on loopback
    libgtest-dev         # GoogleTest (prebuilt static libraries)
    clang-format         # the formatting check (scripts/check_format.sh)
    clang                # libFuzzer for the control-plane fuzz target
    libclang-rt-14-dev
    python3              # test result counting, the Python binding (python/orbitte)
    python3-pytest       # the binding's tests (python/tests)
    python3-numpy        # arrays moved by the binding's tests
    python3-prometheus-client # orbitte.metrics (the Prometheus collector) and its tests
    python3-matplotlib   # tools/plot_bench.py (its test, tests/tools:plot_bench_test)
    fio                  # tools/file_vs_fio.sh (its test, tests/tools:file_vs_fio_test)
    procps               # pkill/ps used by multi-process tests
    pkg-config           # the installed library's consumers (scripts/install_check.sh)
    cmake
    python3-build        # the wheel (scripts/wheel.sh): python3 -m build --no-isolation
    python3-setuptools
    python3-wheel
    python3-venv         # the wheel's install check in a fresh venv
)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
