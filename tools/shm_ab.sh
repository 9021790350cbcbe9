#!/usr/bin/env bash
# tools/shm_ab.sh - same-host speed as same-run ratios: pairs taken back to back, several
# repetitions, medians and spread. A benchmark, not a test.
#
# Each repetition measures, one after the other (never concurrently):
#   UCX before   ucx_perftest -t put_bw -x posix -d memory, 64 MiB, bcopy (client stopped
#                after SECS s; its server is stopped at once: a put_bw server left behind
#                keeps polling a core until its own timeout and skews what runs next)
#   ote_bench --transport shm (cross-memory attach), batch 1, one thread:
#                64 MiB WRITE and READ with host buffers (4 KiB pages), then the same with
#                both buffers on transparent huge pages (--local-mem/--remote-mem thp),
#                then with the local buffer in the engine's shared memory (--local-mem
#                shared: the target's source maps it and copies with memcpy), then
#                with host buffers over the shared ring (OTE_SHM_MODE=ring), then
#                host buffers with register_thp=1 on both engines (OTE_REGISTER_THP=1:
#                registration advises and collapses them to huge pages)
#   UCX after    as before; the anchor of the repetition is the mean of before and after
#   4 KiB x64    ote_bench shm READ, TCP READ, shm WRITE, TCP WRITE (message rates and
#                the p50 latency of one batch)
# and prints its line; at the end the median, minimum and maximum of every ratio.
#
# Usage: tools/shm_ab.sh [repetitions, default 5] [seconds per figure, default 3]
# Environment: OTE_BENCH=path/to/ote_bench (default: bazel-bin/tools/ote_bench, built first).
set -u
set -o pipefail
unset OTE_REGISTER_THP # only the reg figures set it

REPS="${1:-5}"
SECS="${2:-3}"
PORT="${UCX_PORT:-13391}"
cd "$(dirname "$0")/.." || exit 1
if [ -z "${OTE_BENCH:-}" ]; then
    bazel build //tools:ote_bench >&2 || exit 1
    OTE_BENCH=bazel-bin/tools/ote_bench
fi
command -v ucx_perftest >/dev/null || { echo "$0: ucx_perftest missing (Debian ucx-utils)" >&2; exit 1; }
command -v bc >/dev/null || { echo "$0: bc missing" >&2; exit 1; }

# ucx64: GB/s of one put_bw 64 MiB client run (UCX's MB is 2^20 bytes).
ucx64() {
    timeout -k 5 $((SECS + 60)) ucx_perftest -t put_bw -x posix -d memory -s 67108864 -n 1000000000 \
        -w 3 -D bcopy -p "$PORT" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    timeout -s INT -k 5 "$SECS" stdbuf -oL ucx_perftest 127.0.0.1 -t put_bw -x posix -d memory \
        -s 67108864 -n 1000000000 -w 3 -D bcopy -p "$PORT" 2>/dev/null |
        awk '/thread/ { v = $7 } END { if (v != "") printf "%.3f\n", v * 1.048576 / 1000 }'
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
}
# ob TRANSPORT FIELD ARGS...: field FIELD of ote_bench's table row (5 GB/s, 6 msg/s, 9 p50).
ob() {
    local tr="$1" f="$2"
    shift 2
    timeout -k 5 $((SECS * 3 + 60)) "$OTE_BENCH" --transport "$tr" --duration "${SECS}s" --no-progress "$@" \
        2>/dev/null | tail -n 1 | awk -v f="$f" '{ print $f }'
}
div() { echo "scale=3; $1 / $2" | bc -l 2>/dev/null; }

declare -A R
NAMES="W64/UCX W64thp/UCX W64shr/UCX W64ring/UCX W64reg/UCX"
NAMES="$NAMES R64/UCX R64thp/UCX R64shr/UCX R64ring/UCX R64reg/UCX"
NAMES="$NAMES W64shr/W64 R64shr/R64 W64reg/W64 R64reg/R64 R4K/TCP W4K/TCP"
for rep in $(seq "$REPS"); do
    load="$(cut -d' ' -f1 /proc/loadavg)"
    u1="$(ucx64)"
    wh="$(ob shm 5 --op write -b 64M -B 1)"
    wt="$(ob shm 5 --op write -b 64M -B 1 --local-mem thp --remote-mem thp)"
    rh="$(ob shm 5 --op read -b 64M -B 1)"
    rt="$(ob shm 5 --op read -b 64M -B 1 --local-mem thp --remote-mem thp)"
    ws="$(ob shm 5 --op write -b 64M -B 1 --local-mem shared)"
    rs="$(ob shm 5 --op read -b 64M -B 1 --local-mem shared)"
    wq="$(OTE_SHM_MODE=ring ob shm 5 --op write -b 64M -B 1)"
    rq="$(OTE_SHM_MODE=ring ob shm 5 --op read -b 64M -B 1)"
    wg="$(OTE_REGISTER_THP=1 ob shm 5 --op write -b 64M -B 1)"
    rg="$(OTE_REGISTER_THP=1 ob shm 5 --op read -b 64M -B 1)"
    u2="$(ucx64)"
    sr="$(ob shm 6 --op read -b 4K -B 64)" srl="$(ob shm 9 --op read -b 4K -B 64)"
    tr="$(ob tcp 6 --op read -b 4K -B 64)"
    sw="$(ob shm 6 --op write -b 4K -B 64)"
    tw="$(ob tcp 6 --op write -b 4K -B 64)"
    # The anchor: the mean of both UCX runs, or the one that gave a figure (none: no ratio).
    if [ -n "$u1" ] && [ -n "$u2" ]; then u="$(echo "scale=3; ($u1 + $u2) / 2" | bc -l)"; else u="${u1:-$u2}"; fi
    R[W64/UCX]+=" $(div "$wh" "$u")" R[W64thp/UCX]+=" $(div "$wt" "$u")"
    R[R64/UCX]+=" $(div "$rh" "$u")" R[R64thp/UCX]+=" $(div "$rt" "$u")"
    R[W64ring/UCX]+=" $(div "$wq" "$u")" R[R64ring/UCX]+=" $(div "$rq" "$u")"
    R[W64reg/UCX]+=" $(div "$wg" "$u")" R[R64reg/UCX]+=" $(div "$rg" "$u")"
    R[W64shr/UCX]+=" $(div "$ws" "$u")" R[R64shr/UCX]+=" $(div "$rs" "$u")"
    R[W64shr/W64]+=" $(div "$ws" "$wh")" R[R64shr/R64]+=" $(div "$rs" "$rh")"
    R[W64reg/W64]+=" $(div "$wg" "$wh")" R[R64reg/R64]+=" $(div "$rg" "$rh")"
    R[R4K/TCP]+=" $(div "$sr" "$tr")" R[W4K/TCP]+=" $(div "$sw" "$tw")"
    echo "rep $rep load $load: UCX $u1/$u2 GB/s | 64M W $wh thp $wt shared $ws ring $wq reg $wg" \
        "R $rh thp $rt shared $rs ring $rq reg $rg GB/s |" \
        "4K x64 shm R $sr (p50 $srl us) TCP R $tr, shm W $sw TCP W $tw msg/s"
done
echo "ratios over $REPS repetitions: median [min, max]"
for n in $NAMES; do
    printf '%-12s %s\n' "$n" "$(echo "${R[$n]}" | tr ' ' '\n' | grep -v '^$' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a";
               else printf "%.2fx [%.2fx, %.2fx]\n", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }')"
done
