#!/bin/bash
# tools/compare_tcp.sh - OrbitTE's TCP speed against anchors measured in the same run.
#
# Runs back to back on loopback, one after the other (never concurrently):
#   1. ote_bench (self-spawned target on 127.0.0.1): 64 MiB WRITE and READ (one request
#      per batch), and 4 KiB requests in batches of 64 (WRITE and READ; and for
#      information WRITE with two batches in flight, --depth 2);
#   2. iperf3, one TCP stream, server bound to 127.0.0.1;
#   3. ucx_perftest (UCT over tcp on the lo device, UCX_TLS=tcp): put_bw at 64 MiB and
#      am_bw at 4 KiB (the better of the short and bcopy layouts);
#   4. same host: ote_bench --transport shm, cross-memory attach and then shm_mode=ring,
#      64 MiB WRITE/READ and 4 KiB x64 WRITE/READ (cross-memory attach 64 MiB also with
#      buffers on transparent huge pages, and host buffers with register_thp=1, for
#      information; cross-memory attach 64 MiB and 4 KiB x64 also with the local buffer
#      in the engine's shared memory, --local-mem shared: the peer maps it and copies
#      with memcpy), and ucx_perftest over UCX's shared-memory transport
#      (-x posix -d memory) put_bw at 64 MiB (bcopy: posix has no put zcopy) and 4 KiB;
# then prints every figure and OrbitTE's ratios: 64 MiB WRITE and READ against iperf3's
# single-stream throughput (target >= 1.0x), the 4 KiB batch-64 WRITE message rate
# against UCX's am_bw message rate (target >= 2x), and for the same host: shm 64 MiB
# (host and shared local buffers) against UCX posix put_bw 64 MiB (target >= 0.9x) and
# shm 4 KiB x64 (host and shared local buffers) against ote_bench TCP's rate of this run
# (target >= 3x). It is a benchmark, not a test.
#
# iperf3 and ucx-utils come from Debian: installed with apt-get only when missing.
# Every process runs under `timeout`, and a trap stops the servers on any exit.
#
# Usage: tools/compare_tcp.sh [seconds per figure, default 5]
# Environment: OTE_BENCH=path/to/ote_bench (otherwise built with Bazel; BAZEL_STARTUP
# holds extra startup options such as --output_base=...).
set -u
set -o pipefail

SECS="${1:-5}"
case "$SECS" in
    '' | *[!0-9]*) echo "usage: $0 [seconds per figure]" >&2; exit 2 ;;
esac
if [ "$SECS" -lt 1 ] || [ "$SECS" -gt 60 ]; then
    echo "$0: seconds per figure must be in [1, 60]" >&2
    exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d /tmp/compare_tcp.XXXXXX)"
PIDS=()
STATUS=0

# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null
    done
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && wait "$p" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[compare_tcp] $*" >&2; }

# ---- tools -------------------------------------------------------------------------
install_missing() {
    local need=()
    command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
    command -v ucx_perftest >/dev/null 2>&1 || need+=(ucx-utils)
    command -v ss >/dev/null 2>&1 || need+=(iproute2)
    [ "${#need[@]}" -eq 0 ] && return 0
    local sudo=()
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    log "installing ${need[*]} from Debian"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${need[@]}" >/dev/null
}
if ! install_missing; then
    echo "$0: could not install iperf3/ucx-utils with apt-get" >&2
    exit 1
fi

if [ -z "${OTE_BENCH:-}" ]; then
    log "building //tools:ote_bench"
    # shellcheck disable=SC2086  # BAZEL_STARTUP is a list of options
    (cd "$ROOT" && bazel ${BAZEL_STARTUP:-} build --symlink_prefix=/ //tools:ote_bench) >&2 ||
        { echo "$0: bazel build //tools:ote_bench failed" >&2; exit 1; }
    # shellcheck disable=SC2086
    OTE_BENCH="$(cd "$ROOT" && bazel ${BAZEL_STARTUP:-} info bazel-bin 2>/dev/null)/tools/ote_bench"
fi
[ -x "$OTE_BENCH" ] || { echo "$0: no ote_bench at '$OTE_BENCH'" >&2; exit 1; }

# ---- helpers -----------------------------------------------------------------------
# A TCP port nothing listens on.
free_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 40000))
        if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# Wait (at most 10 s) until something listens on the port, or the server died.
wait_listen() {
    local port="$1" pid="$2"
    for _ in $(seq 200); do
        [ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ] && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# Stop a background server and forget it.
stop_server() {
    local pid="$1" i
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    for i in "${!PIDS[@]}"; do
        [ "${PIDS[$i]}" = "$pid" ] && unset "PIDS[$i]"
    done
}

# json_field LINE KEY: a number or string value of a flat JSON object.
json_field() {
    printf '%s' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

fmt() { awk -v v="$1" -v f="$2" 'BEGIN { if (v == "") print "n/a"; else printf f, v }'; }
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2fx", a / b }'
}

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 1. ote_bench ------------------------------------------------------------------
# ote NAME ARGS...: one result line; sets OTE_<NAME>_GBPS and OTE_<NAME>_OPS.
ote() {
    local name="$1" line
    shift
    log "ote_bench $*"
    line="$(timeout -k 5 $((SECS * 3 + 60)) "$OTE_BENCH" --no-progress --json --duration "${SECS}s" "$@" \
        2>"$TMP/ote_$name.err" | tail -n 1)"
    if [ -z "$line" ] || [ "$(json_field "$line" check)" = "failed" ]; then
        log "ote_bench $name failed:"
        cat "$TMP/ote_$name.err" >&2
        STATUS=1
        return 1
    fi
    printf -v "OTE_${name}_GBPS" '%s' "$(json_field "$line" gbps)"
    printf -v "OTE_${name}_OPS" '%s' "$(json_field "$line" ops_per_sec)"
}
OTE_W64M_GBPS="" OTE_R64M_GBPS="" OTE_W4K_OPS="" OTE_R4K_OPS="" OTE_W4KD2_OPS=""
ote W64M --op write --block-size 64M --batch-size 1
ote R64M --op read --block-size 64M --batch-size 1
ote W4K --op write --block-size 4K --batch-size 64
ote R4K --op read --block-size 4K --batch-size 64
# Information only: the same requests with two batches per thread in flight.
ote W4KD2 --op write --block-size 4K --batch-size 64 --depth 2

# ---- 2. iperf3, one stream ---------------------------------------------------------
IPERF_GBPS=""
if port="$(free_port)"; then
    log "iperf3 -c 127.0.0.1 -p $port -t $SECS (one stream)"
    timeout -k 5 $((SECS + 60)) iperf3 -s -B 127.0.0.1 -p "$port" -1 >"$TMP/iperf_srv.txt" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    if wait_listen "$port" "$srv"; then
        if timeout -k 5 $((SECS + 30)) iperf3 -c 127.0.0.1 -B 127.0.0.1 -p "$port" -P 1 -t "$SECS" -J \
            >"$TMP/iperf.json" 2>&1; then
            # bits_per_second of the "sum_received" object (what the receiver got).
            bps="$(awk '/"sum_received"/ { s = 1 } s && /"bits_per_second"/ { gsub(/[^0-9.e+]/, "", $2); print $2; exit }' \
                "$TMP/iperf.json")"
            IPERF_GBPS="$(awk -v b="$bps" 'BEGIN { if (b != "") printf "%.4f", b / 8 / 1e9 }')"
        fi
    fi
    [ -z "$IPERF_GBPS" ] && { log "iperf3 failed"; cat "$TMP/iperf.json" "$TMP/iperf_srv.txt" >&2; STATUS=1; }
    stop_server "$srv"
fi

# ---- 3. ucx_perftest over tcp --------------------------------------------------------
# ucx TEST SIZE WARMUP LAYOUT: prints "overall_bw_MBps overall_mr" of the client.
# ucx_perftest has no duration option, so the client gets a huge iteration count and is
# stopped after SECS seconds (plus warm-up slack); its per-second CSV lines carry the
# running "overall" figures, and the last one is taken. UCX's MB is 2^20 bytes. The UCT
# test uses the tcp transport on the lo device; the perftest's own rendezvous socket
# listens on all addresses (1.13 has no bind option), but the client connects over
# 127.0.0.1.
# ucx TEST SIZE WARMUP LAYOUT [TL DEV]: the UCT transport TL on device DEV (default tcp
# on lo; posix on memory is UCX's shared-memory transport).
ucx() {
    local test="$1" size="$2" warmup="$3" layout="$4" tl="${5:-tcp}" dev="${6:-lo}"
    local iters=1000000000 port srv out=""
    port="$(free_port)" || return 1
    log "ucx_perftest -t $test -x $tl -d $dev -s $size -D $layout (${SECS} s)"
    UCX_TLS=$tl timeout -k 5 $((SECS + 60)) ucx_perftest -t "$test" -x "$tl" -d "$dev" -D "$layout" \
        -s "$size" -n "$iters" -w "$warmup" -p "$port" >"$TMP/ucx_srv.txt" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    if wait_listen "$port" "$srv"; then
        UCX_TLS=$tl timeout -s INT -k 5 $((SECS + 2)) stdbuf -oL ucx_perftest 127.0.0.1 \
            -t "$test" -x "$tl" -d "$dev" -D "$layout" -s "$size" -n "$iters" -w "$warmup" \
            -p "$port" -v >"$TMP/ucx_cli.txt" 2>"$TMP/ucx_cli.err"
        out="$(sed 's/^\[thread [0-9]*\]//' "$TMP/ucx_cli.txt" |
            awk -F, '$1 ~ /^ *[0-9]+$/ && NF >= 8 { gsub(/ /, ""); print $6, $8 }' | tail -n 1)"
    fi
    stop_server "$srv"
    if [ -z "$out" ]; then
        log "ucx_perftest $test failed"
        cat "$TMP/ucx_srv.txt" "$TMP/ucx_cli.txt" "$TMP/ucx_cli.err" >&2
        return 1
    fi
    echo "$out"
}

UCX_PUT_GBPS="" UCX_AM_MR="" UCX_AM_LAYOUT=""
if r="$(ucx put_bw 67108864 3 zcopy)"; then
    UCX_PUT_GBPS="$(awk -v m="${r%% *}" 'BEGIN { printf "%.4f", m * 1048576 / 1e9 }')"
else
    STATUS=1
fi
for layout in short bcopy; do
    if r="$(ucx am_bw 4096 10000 "$layout")"; then
        mr="${r##* }"
        if [ -z "$UCX_AM_MR" ] || awk -v a="$mr" -v b="$UCX_AM_MR" 'BEGIN { exit !(a > b) }'; then
            UCX_AM_MR="$mr"
            UCX_AM_LAYOUT="$layout"
        fi
    fi
done
[ -z "$UCX_AM_MR" ] && STATUS=1

# ---- 4. same host: ote_bench shm against UCX's shared-memory transport ----------------
OTE_SW64M_GBPS="" OTE_SR64M_GBPS="" OTE_SW4K_OPS="" OTE_SR4K_OPS=""
ote SW64M --transport shm --op write --block-size 64M --batch-size 1
ote SR64M --transport shm --op read --block-size 64M --batch-size 1
# The same with both buffers on transparent huge pages (--local-mem/--remote-mem thp): a
# cross-memory-attach copy pins the peer's pages per call, one 2 MiB page instead of 512.
# Information only: UCX's posix segment is on 4 KiB pages (no hugetlb pages configured).
OTE_TW64M_GBPS="" OTE_TR64M_GBPS=""
ote TW64M --transport shm --op write --block-size 64M --batch-size 1 --local-mem thp --remote-mem thp
ote TR64M --transport shm --op read --block-size 64M --batch-size 1 --local-mem thp --remote-mem thp
# Host buffers (4 KiB pages) with register_thp=1 on both engines: their registration
# advises and collapses them to huge pages (docs/performance.md "Same host"). Information only.
OTE_GW64M_GBPS="" OTE_GR64M_GBPS=""
OTE_REGISTER_THP=1 ote GW64M --transport shm --op write --block-size 64M --batch-size 1
OTE_REGISTER_THP=1 ote GR64M --transport shm --op read --block-size 64M --batch-size 1
# The local buffer in the engine's shared memory (--local-mem shared:
# ote_memory_alloc_shared): the target's source maps it once per connection and copies
# with memcpy instead of a cross-memory-attach call that pins every page per request.
OTE_HW64M_GBPS="" OTE_HR64M_GBPS="" OTE_HW4K_OPS="" OTE_HR4K_OPS=""
ote HW64M --transport shm --op write --block-size 64M --batch-size 1 --local-mem shared
ote HR64M --transport shm --op read --block-size 64M --batch-size 1 --local-mem shared
ote SW4K --transport shm --op write --block-size 4K --batch-size 64
ote SR4K --transport shm --op read --block-size 4K --batch-size 64
ote HW4K --transport shm --op write --block-size 4K --batch-size 64 --local-mem shared
ote HR4K --transport shm --op read --block-size 4K --batch-size 64 --local-mem shared
# The same over the shared ring (shm_mode=ring, which both processes inherit).
OTE_QW64M_GBPS="" OTE_QR64M_GBPS="" OTE_QW4K_OPS="" OTE_QR4K_OPS=""
export OTE_SHM_MODE=ring
ote QW64M --transport shm --op write --block-size 64M --batch-size 1
ote QR64M --transport shm --op read --block-size 64M --batch-size 1
ote QW4K --transport shm --op write --block-size 4K --batch-size 64
ote QR4K --transport shm --op read --block-size 4K --batch-size 64
unset OTE_SHM_MODE
UCX_SHM_PUT_GBPS="" UCX_SHM_PUT4K_MR=""
if r="$(ucx put_bw 67108864 3 bcopy posix memory)"; then
    UCX_SHM_PUT_GBPS="$(awk -v m="${r%% *}" 'BEGIN { printf "%.4f", m * 1048576 / 1e9 }')"
else
    STATUS=1
fi
if r="$(ucx put_bw 4096 10000 short posix memory)" || r="$(ucx put_bw 4096 10000 bcopy posix memory)"; then
    UCX_SHM_PUT4K_MR="${r##* }"
else
    STATUS=1
fi

# ---- report ------------------------------------------------------------------------
echo
echo "OrbitTE TCP vs anchors, loopback, $(nproc) CPUs, ${SECS} s per figure, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "load average at start: $LOAD_START, at end: $(cut -d' ' -f1-3 /proc/loadavg) (other work skews every figure)"
printf '%-52s %14s\n' "figure" "value"
printf '%-52s %14s\n' "ote_bench WRITE 64 MiB, batch 1, 1 thread" "$(fmt "$OTE_W64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench READ  64 MiB, batch 1, 1 thread" "$(fmt "$OTE_R64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "iperf3 one stream (receiver)" "$(fmt "$IPERF_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ucx_perftest put_bw 64 MiB (UCX_TLS=tcp, zcopy)" "$(fmt "$UCX_PUT_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench WRITE 4 KiB, batch 64, 1 thread" "$(fmt "$OTE_W4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench READ  4 KiB, batch 64, 1 thread" "$(fmt "$OTE_R4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench WRITE 4 KiB, batch 64, depth 2 (info)" "$(fmt "$OTE_W4KD2_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ucx_perftest am_bw 4 KiB (UCX_TLS=tcp, ${UCX_AM_LAYOUT:-?})" "$(fmt "$UCX_AM_MR" '%.0f msg/s')"
echo
echo "ratios (target)"
printf '%-52s %14s\n' "WRITE 64 MiB / iperf3 one stream (>= 1.0x)" "$(ratio "$OTE_W64M_GBPS" "$IPERF_GBPS")"
printf '%-52s %14s\n' "READ  64 MiB / iperf3 one stream (>= 1.0x)" "$(ratio "$OTE_R64M_GBPS" "$IPERF_GBPS")"
printf '%-52s %14s\n' "WRITE 4 KiB x64 rate / UCX am_bw 4 KiB rate (>= 2x)" "$(ratio "$OTE_W4K_OPS" "$UCX_AM_MR")"
printf '%-52s %14s\n' "READ  4 KiB x64 rate / UCX am_bw 4 KiB rate (info)" "$(ratio "$OTE_R4K_OPS" "$UCX_AM_MR")"
printf '%-52s %14s\n' "WRITE 64 MiB / UCX put_bw 64 MiB (info)" "$(ratio "$OTE_W64M_GBPS" "$UCX_PUT_GBPS")"
echo
echo "same host: ote_bench --transport shm (cross-memory attach; ring: shm_mode=ring) vs UCX posix and ote_bench TCP"
printf '%-52s %14s\n' "ote_bench shm WRITE 64 MiB, batch 1, 1 thread" "$(fmt "$OTE_SW64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm READ  64 MiB, batch 1, 1 thread" "$(fmt "$OTE_SR64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm WRITE 64 MiB, thp buffers (info)" "$(fmt "$OTE_TW64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm READ  64 MiB, thp buffers (info)" "$(fmt "$OTE_TR64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm WRITE 64 MiB, register_thp=1 (info)" "$(fmt "$OTE_GW64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm READ  64 MiB, register_thp=1 (info)" "$(fmt "$OTE_GR64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm WRITE 64 MiB, shared local buffer" "$(fmt "$OTE_HW64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm READ  64 MiB, shared local buffer" "$(fmt "$OTE_HR64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm ring WRITE 64 MiB, batch 1, 1 thread" "$(fmt "$OTE_QW64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm ring READ  64 MiB, batch 1, 1 thread" "$(fmt "$OTE_QR64M_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ucx_perftest put_bw 64 MiB (posix memory, bcopy)" "$(fmt "$UCX_SHM_PUT_GBPS" '%.3f GB/s')"
printf '%-52s %14s\n' "ote_bench shm WRITE 4 KiB, batch 64, 1 thread" "$(fmt "$OTE_SW4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench shm READ  4 KiB, batch 64, 1 thread" "$(fmt "$OTE_SR4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench shm WRITE 4 KiB x64, shared local buffer" "$(fmt "$OTE_HW4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench shm READ  4 KiB x64, shared local buffer" "$(fmt "$OTE_HR4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench shm ring WRITE 4 KiB, batch 64, 1 thread" "$(fmt "$OTE_QW4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ote_bench shm ring READ  4 KiB, batch 64, 1 thread" "$(fmt "$OTE_QR4K_OPS" '%.0f msg/s')"
printf '%-52s %14s\n' "ucx_perftest put_bw 4 KiB (posix memory)" "$(fmt "$UCX_SHM_PUT4K_MR" '%.0f msg/s')"
echo "ratios (target)"
printf '%-52s %14s\n' "shm WRITE 64 MiB / UCX posix put_bw 64 MiB (>= 0.9x)" "$(ratio "$OTE_SW64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm READ  64 MiB / UCX posix put_bw 64 MiB (>= 0.9x)" "$(ratio "$OTE_SR64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm WRITE 64 MiB thp / UCX posix put_bw 64 MiB (info)" "$(ratio "$OTE_TW64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm READ  64 MiB thp / UCX posix put_bw 64 MiB (info)" "$(ratio "$OTE_TR64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm WRITE 64 MiB register_thp=1 / UCX posix (info)" "$(ratio "$OTE_GW64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm READ  64 MiB register_thp=1 / UCX posix (info)" "$(ratio "$OTE_GR64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm WRITE 64 MiB shared / UCX posix put_bw (>= 0.9x)" "$(ratio "$OTE_HW64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm READ  64 MiB shared / UCX posix put_bw (>= 0.9x)" "$(ratio "$OTE_HR64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "ring WRITE 64 MiB / UCX posix put_bw 64 MiB (>= 0.6x)" "$(ratio "$OTE_QW64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "ring READ  64 MiB / UCX posix put_bw 64 MiB (>= 0.6x)" "$(ratio "$OTE_QR64M_GBPS" "$UCX_SHM_PUT_GBPS")"
printf '%-52s %14s\n' "shm WRITE 4 KiB x64 / TCP WRITE 4 KiB x64 (>= 3x)" "$(ratio "$OTE_SW4K_OPS" "$OTE_W4K_OPS")"
printf '%-52s %14s\n' "shm READ  4 KiB x64 / TCP READ  4 KiB x64 (>= 3x)" "$(ratio "$OTE_SR4K_OPS" "$OTE_R4K_OPS")"
printf '%-52s %14s\n' "shm WRITE 4 KiB x64 shared / TCP WRITE 4 KiB (>= 3x)" "$(ratio "$OTE_HW4K_OPS" "$OTE_W4K_OPS")"
printf '%-52s %14s\n' "shm READ  4 KiB x64 shared / TCP READ  4 KiB (>= 3x)" "$(ratio "$OTE_HR4K_OPS" "$OTE_R4K_OPS")"
printf '%-52s %14s\n' "ring WRITE 4 KiB x64 / TCP WRITE 4 KiB x64 (info)" "$(ratio "$OTE_QW4K_OPS" "$OTE_W4K_OPS")"
printf '%-52s %14s\n' "ring READ  4 KiB x64 / TCP READ  4 KiB x64 (info)" "$(ratio "$OTE_QR4K_OPS" "$OTE_R4K_OPS")"
printf '%-52s %14s\n' "shm WRITE 4 KiB x64 / UCX posix put_bw 4 KiB (info)" "$(ratio "$OTE_SW4K_OPS" "$UCX_SHM_PUT4K_MR")"
exit "$STATUS"
