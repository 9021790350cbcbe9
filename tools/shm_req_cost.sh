#!/usr/bin/env bash
# tools/shm_req_cost.sh - CPU cost of the same-host (shm) engine per 4 KiB request,
# measured in instructions with valgrind --tool=callgrind.
#
# Method
#   1. //tests/engine:shm_req_cost runs two engines in one process (source and requester,
#      transports=shm, cross-memory attach probed and granted, small pieces through the
#      ring), warms up (connection made), then WRITEs N 4 KiB requests in batches of 64:
#      per batch one REQS message, the source's checks and pins, its copies out of the
#      ring, one RESPS message.
#   2. It runs under callgrind twice, with N1 and N2 requests. Fixed costs (process and
#      engine setup, the driver's 128 MiB buffer fill, teardown) cancel in the difference;
#      the per-request figure is (cost(N2) - cost(N1)) / (N2 - N1).
#   3. callgrind_annotate --inclusive=no (self cost per function, every function) is summed
#      by source file:
#        engine   self instructions of OrbitTE's engine/ and base/ (requester + source)
#        memcpy   libc memcpy/memmove/memset: the payload copies (the requester stages
#                 each piece in the ring, the source copies it out): excluded
#        libc     every other library function (mutexes, malloc, poll/send/recv wrappers):
#                 reported separately, as what the engine's libc calls add
#      The waiting threads' short spins (poll with a zero timeout before they sleep)
#      count as they run under valgrind's serialised threads.
#
# Usage: tools/shm_req_cost.sh [N1 N2]   (multiples of 64; default 1280 6400)
#   BAZEL_OUTPUT_BASE=... selects a Bazel output base (default: Bazel's own).
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${1:-1280}
N2=${2:-6400}
if ((N1 % 64 != 0 || N2 % 64 != 0 || N2 <= N1)); then
    echo "usage: $0 [N1 N2] with N1 < N2, both multiples of 64" >&2
    exit 2
fi

. tools/cost_lib.sh
cost_setup shm_req_cost
ENG='/(engine|base)/[^ ]*[.][ch]:'
measure() { cost_measure "$1" "$ENG" 'memmove|memcpy|memset'; } # "engine verbs copy libc total"

read -r e1 _ c1 l1 t1 < <(measure "$N1")
read -r e2 _ c2 l2 t2 < <(measure "$N2")
D=$((N2 - N1))
echo "callgrind, $N1 and $N2 requests of 4 KiB in batches of 64 (difference: $D); instructions per request:"
awk -v d="$D" -v e=$((e2 - e1)) -v c=$((c2 - c1)) -v l=$((l2 - l1)) -v t=$((t2 - t1)) 'BEGIN {
    printf "  engine self (engine/ base/, requester + source):      %8.0f\n", e / d
    printf "  other libc (mutex, malloc, syscall wrappers):          %8.0f\n", l / d
    printf "  memcpy/memset, the payload copies (excluded):          %8.0f\n", c / d
    printf "  whole process:                                         %8.0f\n", t / d
}'
