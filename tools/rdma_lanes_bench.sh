#!/usr/bin/env bash
# tools/rdma_lanes_bench.sh - grant throughput over verbs/sim with 1 CQ lane and 1
# requester thread against 2 lanes and 2 requester threads of one grant manager, measured
# in the same run (issue 25 part 4: lanes in parallel).
#
# Method: //tests/grant:lanes_bench (-c opt) in bench mode. One process holds the rig of
# tests/grant/rig.h: a requester context and a source context of one sim instance (no port
# bandwidth limit), two lanes each, one pool of two CQ workers (worker i polls lane i of
# both contexts). Each requester thread owns one slot of a WRITE endpoint (slot i on lane i)
# and keeps WINDOW grants of KIB KiB in flight; a grant is the whole protocol (the source
# binds a type-2 window, answers, the requester posts the slices and the SEND_WITH_INV
# receipt, the source's receive CQE ends the source grant). Rounds alternate 1L x 1T and
# 2L x 2T; the ratio of each pair and of the medians is printed.
#
# Usage: tools/rdma_lanes_bench.sh [seconds-per-run [rounds]]
#   KIB=256 (grant size), WINDOW=4 (grants in flight per thread); PERF=1 also records
#   `perf record -g` of the whole run into $PERF_OUT (default /tmp/rdma_lanes_bench.perf)
#   and prints the top of `perf report --sort comm,dso` (where the time goes, per thread).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-3}
ROUNDS=${2:-3}
bazel build --jobs=2 -c opt //tests/grant:lanes_bench >&2
BIN="$(bazel info -c opt bazel-bin 2>/dev/null)/tests/grant/lanes_bench"
export OTE_LANES_BENCH="$SECS" OTE_LANES_BENCH_ROUNDS="$ROUNDS"
export OTE_LANES_BENCH_KIB="${KIB:-256}" OTE_LANES_BENCH_WINDOW="${WINDOW:-4}"
echo "machine: $(nproc) CPUs"
if [ "${PERF:-0}" = 1 ]; then
    OUT=${PERF_OUT:-/tmp/rdma_lanes_bench.perf}
    perf record -q -g -o "$OUT" "$BIN" --gtest_brief=1 | grep -v '^\[' || true
    perf report -i "$OUT" --no-children --sort comm,dso --stdio 2>/dev/null | grep -v '^#' |
        grep -v '^$' | head -30
else
    "$BIN" --gtest_brief=1 | grep -v '^\['
fi
