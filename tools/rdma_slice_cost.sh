#!/usr/bin/env bash
# tools/rdma_slice_cost.sh - CPU cost of the RDMA engine per 64 KiB slice, excluding the
# sim provider, measured in instructions with valgrind --tool=callgrind.
#
# Method
#   1. //tests/engine:rdma_slice_cost runs two engines in one process (source and
#      requester, transport=rdma over verbs/sim, slice_size=1M), warms up (QPs built,
#      MW pool primed), then WRITEs N 64 KiB slices as 1 MiB requests (one grant of 16
#      slices each: GRANT_REQ/RESP on the control socket, MW bind, 16 RDMA WRITEs, the
#      SEND_WITH_INV receipt), 8 requests per batch.
#   2. It runs under callgrind twice, with N1 and N2 slices. Fixed costs (process and
#      engine setup, warm-up, teardown, the driver's buffer fill) cancel in the
#      difference; the per-slice figure is (cost(N2) - cost(N1)) / (N2 - N1).
#   3. callgrind_annotate --inclusive=no (self cost per function, every function:
#      --threshold=100, --auto=no) is summed by source file:
#        engine   self instructions of OrbitTE's own layers: engine/ grant/ endpoint/
#                 qp/ cq/ context/ base/  (both sides: requester and source)
#        verbs    verbs/ (the sim provider and the verbs table): excluded
#        memcpy   libc memcpy/memmove: the sim's payload copy (about 1 per byte): excluded
#        libc     every other library function (mutexes, malloc, syscall wrappers),
#                 called by both the engine and the sim: reported separately, as the
#                 most that could be added to the engine figure
#      Polling threads (monitor every 2 ms, control connections every 10 ms) are counted
#      for as long as the extra slices take, as they would be in production.
#
# Figure (2026-11-29, gcc -O2 -g, Debian valgrind 3.19; five runs, N2 1280 or 2304):
#   engine self  1,610 - 1,780 instructions per 64 KiB slice (requester + source together)
#   libc other   2,120 - 2,290 per slice (shared with the sim: at most this much more)
#   verbs/sim    ~1,420 per slice, memcpy ~65,500 per slice (excluded)
#   so at most ~4,000 instructions per slice for the engine with every libc call it makes.
#
# Usage: tools/rdma_slice_cost.sh [N1 N2]   (multiples of 16; default 256 1280)
#   BAZEL_OUTPUT_BASE=... selects a Bazel output base (default: Bazel's own).
#   REQ_MIB=m (1..64, a power of 2): m MiB requests (N1, N2 multiples of 16 m), so that a
#   grant covers several 1 MiB engine slices (one per request per device up to
#   rdma_grant_max); OTE_RDMA_GRANT_MAX=1M gives back one grant per 1 MiB slice.
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${1:-256}
N2=${2:-1280}
M=$((16 * ${REQ_MIB:-1}))
if (( N1 % M != 0 || N2 % M != 0 || N2 <= N1 )); then
    echo "usage: [REQ_MIB=m] $0 [N1 N2] with N1 < N2, both multiples of 16 x m" >&2
    exit 2
fi

. tools/cost_lib.sh
cost_setup rdma_slice_cost
ENG='/(engine|grant|endpoint|qp|cq|context|base)/[^ ]*[.][ch]:'
measure() { cost_measure "$1" "$ENG" 'memmove|memcpy'; } # "engine verbs memcpy libc total"

read -r e1 v1 c1 l1 t1 < <(measure "$N1")
read -r e2 v2 c2 l2 t2 < <(measure "$N2")
D=$((N2 - N1))
echo "callgrind, $N1 and $N2 slices of 64 KiB (difference: $D slices); instructions per slice:"
awk -v d="$D" -v e=$((e2 - e1)) -v v=$((v2 - v1)) -v c=$((c2 - c1)) -v l=$((l2 - l1)) -v t=$((t2 - t1)) 'BEGIN {
    printf "  engine self (engine grant endpoint qp cq context base): %8.0f\n", e / d
    printf "  other libc (mutex, malloc, syscalls; engine and sim):   %8.0f\n", l / d
    printf "  verbs/sim (excluded):                                   %8.0f\n", v / d
    printf "  memcpy, the sim payload copy (excluded):                %8.0f\n", c / d
    printf "  whole process:                                          %8.0f\n", t / d
}'
