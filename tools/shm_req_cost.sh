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
# Usage: tools/shm_req_cost.sh [--base REV] [--runs K] [N1 N2]
#   N1 N2        request counts, multiples of 64 (default 1280 6400)
#   --base REV   also measure git revision REV (e.g. main), built apart from this tree, in
#                the same run, and print both columns and the change: the cost of a change
#                before and after it, on one machine at one time
#   --runs K     measure each count K times and average (default 1): the waiting threads'
#                spins make single runs differ by about 1%
#   BAZEL_OUTPUT_BASE=... selects a Bazel output base for this tree (default: Bazel's own).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_REV=""
RUNS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE_REV=${2:?--base needs a revision}; shift 2 ;;
        --runs) RUNS=${2:?--runs needs a count}; shift 2 ;;
        *) break ;;
    esac
done
N1=${1:-1280}
N2=${2:-6400}
if ((N1 % 64 != 0 || N2 % 64 != 0 || N2 <= N1 || RUNS < 1)); then
    echo "usage: $0 [--base REV] [--runs K] [N1 N2] with N1 < N2, both multiples of 64" >&2
    exit 2
fi

. tools/cost_lib.sh
cost_setup shm_req_cost
if [ -n "$BASE_REV" ]; then cost_setup_base "$BASE_REV" shm_req_cost; fi
ENG='/(engine|base)/[^ ]*[.][ch]:'
measure() { cost_measure "$1" "$ENG" 'memmove|memcpy|memset' "$2"; } # "engine verbs copy libc total"

# Per request, averaged over RUNS: "engine copy libc total" of binary $1.
per_request() {
    local bin=$1 e=0 c=0 l=0 t=0 r e1 c1 l1 t1 e2 c2 l2 t2
    for ((r = 0; r < RUNS; r++)); do
        read -r e1 _ c1 l1 t1 < <(measure "$N1" "$bin")
        read -r e2 _ c2 l2 t2 < <(measure "$N2" "$bin")
        e=$((e + e2 - e1)) c=$((c + c2 - c1)) l=$((l + l2 - l1)) t=$((t + t2 - t1))
    done
    awk -v d=$(((N2 - N1) * RUNS)) -v e=$e -v c=$c -v l=$l -v t=$t \
        'BEGIN { printf "%.1f %.1f %.1f %.1f\n", e / d, c / d, l / d, t / d }'
}

read -r E C L T < <(per_request "$BIN")
echo "callgrind, $N1 and $N2 requests of 4 KiB in batches of 64 (difference: $((N2 - N1)), $RUNS run(s) each); instructions per request:"
if [ -z "$BASE_REV" ]; then
    awk -v e="$E" -v c="$C" -v l="$L" -v t="$T" 'BEGIN {
        printf "  engine self (engine/ base/, requester + source):      %8.0f\n", e
        printf "  other libc (mutex, malloc, syscall wrappers):          %8.0f\n", l
        printf "  memcpy/memset, the payload copies (excluded):          %8.0f\n", c
        printf "  whole process:                                         %8.0f\n", t
    }'
    exit 0
fi
read -r BE BC BL BT < <(per_request "$BASE_BIN")
echo "                                                        $(printf '%10s %10s %8s' "$BASE_REV" "this tree" change)"
awk -v e="$E" -v c="$C" -v l="$L" -v t="$T" -v be="$BE" -v bc="$BC" -v bl="$BL" -v bt="$BT" '
    function row(name, b, a, pct) {
        pct = 0
        if (b > 0) pct = 100 * (a - b) / b
        printf "  %-52s %10.0f %10.0f %+7.1f%%\n", name, b, a, pct
    }
    BEGIN {
        row("engine self (engine/ base/, requester + source):", be, e)
        row("other libc (mutex, malloc, syscall wrappers):", bl, l)
        row("engine self + other libc:", be + bl, e + l)
        row("memcpy/memset, the payload copies (excluded):", bc, c)
        row("whole process:", bt, t)
    }'
