#!/usr/bin/env bash
# tools/py_submit_bench.sh - Python submission (Batch.submit_arrays, and the per-tuple
# Batch.submit) against ote_bench, WRITE 4,096 x 4 KiB per batch over shm, in one run
# (issue 27: submit_arrays should reach 0.8x of ote_bench's requests/s). Builds
# liborbitte.so and ote_bench, then runs tools/py_submit_bench.py.
#
# Usage: tools/py_submit_bench.sh [seconds-per-figure [transport]]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build --jobs=2 //engine:liborbitte.so //tools:ote_bench >&2
BIN="$(bazel info bazel-bin 2>/dev/null)"
export ORBITTE_LIBRARY="$BIN/engine/liborbitte.so"
exec /usr/bin/python3 tools/py_submit_bench.py "$BIN/tools/ote_bench" "${1:-3}" "${2:-shm}"
