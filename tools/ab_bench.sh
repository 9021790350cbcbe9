#!/usr/bin/env bash
# tools/ab_bench.sh - two builds of ote_bench, A and B, measured back to back in one
# command: for each repetition and each case, A then B (the order alternates between
# repetitions), each on its own loopback target child. Prints every pair and, at the end,
# per case the median, minimum and maximum of B/A for GB/s and messages/s. A benchmark
# for a refactor ("behaviour unchanged, speed within noise"), not a test: these machines
# are shared and noisy, so only the ratios of one run mean anything.
#
# Usage: tools/ab_bench.sh A_OTE_BENCH B_OTE_BENCH [repetitions, default 5] [seconds, default 2]
# Cases: tcp, shm and rdma (verbs sim) WRITE and READ of 64 KiB x16 and 4 KiB x64, one
# thread (OTE_AB_CASES="transport:op:block:batch ..." replaces the list).
set -u
set -o pipefail
A="${1:?usage: $0 A_OTE_BENCH B_OTE_BENCH [reps] [seconds]}"
B="${2:?usage: $0 A_OTE_BENCH B_OTE_BENCH [reps] [seconds]}"
REPS="${3:-5}"
SECS="${4:-2}"
CASES="${OTE_AB_CASES:-tcp:write:64K:16 tcp:read:64K:16 tcp:write:4K:64 tcp:read:4K:64 \
shm:write:64K:16 shm:read:64K:16 shm:write:4K:64 shm:read:4K:64 \
rdma:write:64K:16 rdma:read:64K:16 rdma:write:4K:64 rdma:read:4K:64}"
for bin in "$A" "$B"; do
    [ -x "$bin" ] || { echo "$0: $bin is not an executable ote_bench" >&2; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# One figure: "gbps ops_per_sec" of bench $1 for case $2, or "" when it failed.
one() {
    local bin=$1 tp op bs bb env=()
    IFS=: read -r tp op bs bb <<<"$2"
    [ "$tp" = rdma ] && env=(OTE_VERBS_PROVIDER=sim)
    env "${env[@]}" timeout 120 "$bin" --transport "$tp" --op "$op" -b "$bs" -B "$bb" \
        -d "$SECS" --json --no-progress 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"):
        r=json.loads(l); print(r["gbps"], r["ops_per_sec"]); break'
}

for rep in $(seq 1 "$REPS"); do
    for c in $CASES; do
        if [ $((rep % 2)) -eq 1 ]; then a=$(one "$A" "$c"); b=$(one "$B" "$c")
        else b=$(one "$B" "$c"); a=$(one "$A" "$c"); fi
        echo "rep $rep $c A: ${a:-failed} B: ${b:-failed}"
        [ -n "$a" ] && [ -n "$b" ] && echo "$c $a $b" >>"$TMP/pairs"
    done
done
[ -s "$TMP/pairs" ] || { echo "$0: no figure" >&2; exit 1; }
python3 - "$TMP/pairs" <<'PY'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    c, ag, ao, bg, bo = line.split()
    by.setdefault(c, []).append((float(bg) / float(ag), float(bo) / float(ao)))
print("%-20s %6s %6s %6s   (B/A of GB/s; messages/s alike)" % ("case", "median", "min", "max"))
for c, rs in by.items():
    g = [r[0] for r in rs]
    print("%-20s %6.3f %6.3f %6.3f   n=%d" % (c, statistics.median(g), min(g), max(g), len(g)))
PY
