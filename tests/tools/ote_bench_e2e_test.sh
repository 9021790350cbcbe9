#!/bin/bash
# End-to-end test of ote_bench: it spawns its own target child on loopback, moves a
# small, fixed number of bytes with --check --json, and must print one JSON line per
# result with exactly the contract keys and check "ok". --test-corrupt damages one byte
# of the transfer (WRITE: the source before sending; READ: the destination before the
# check), so the check must then say "failed" and the exit status must be 1: this proves
# the check really looks at the bytes. Every run is bounded by `timeout`.
#
# Device memory (--local-mem/--remote-mem cuda:0) runs over the fake libcuda (its path the
# second argument), which is how the test mode of docs/performance.md runs it.
#
# Usage (from Bazel): ote_bench_e2e_test.sh <path to ote_bench> <path to libfake_cuda.so>
set -u

BENCH="${1:?usage: $0 <ote_bench>}"
FAKE_CUDA="${2:?usage: $0 <ote_bench> <libfake_cuda.so>}"
KEYS="transport op block_size batch_size threads bytes seconds gbps ops_per_sec lat_avg_us lat_p50_us lat_p99_us lat_p999_us check local_mem remote_mem path per_nic grants"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); echo "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $1"; }

# run NAME EXPECTED_RC ARGS... : runs ote_bench, keeps stdout/stderr in $TMP/NAME.{out,err}.
# Runs that name no transport run over tcp (the bench's default is the library's shm,tcp,
# which on one host is shm; default_transport runs with it), unless NO_TCP=1.
run() {
    local name="$1" want="$2" t=(--transport tcp)
    shift 2
    case " $* " in *" --transport "* | *" --transports "*) t=() ;; esac
    [ "${NO_TCP:-0}" = 1 ] && t=()
    timeout -k 5 120 "$BENCH" --no-progress "${t[@]}" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit status $rc, want $want"
        echo "--- stdout"; cat "$TMP/$name.out"; echo "--- stderr"; cat "$TMP/$name.err"
        return 1
    fi
    return 0
}

# json_ok NAME LINES CHECK MIN_BYTES [TRANSPORT]: every stdout line is a JSON object with
# exactly the contract keys in order, check == CHECK, bytes >= MIN_BYTES and transport ==
# TRANSPORT (default tcp); there are LINES lines.
json_ok() {
    local name="$1" lines="$2" check="$3" min_bytes="$4" transport="${5:-tcp}" n=0 ok=1 line keys bytes
    while IFS= read -r line; do
        n=$((n + 1))
        case "$line" in
            "{"*"}") ;;
            *) echo "not a JSON object: $line"; ok=0; continue ;;
        esac
        # per_nic's members are device names: its keys are checked below, not here
        keys=$(printf '%s' "$line" | sed 's/"per_nic":{[^}]*}/"per_nic":{}/' |
            grep -o '"[a-z0-9_]*":' | tr -d '":' | tr '\n' ' ')
        if [ "${keys% }" != "$KEYS" ]; then
            echo "keys '${keys% }' != '$KEYS'"; ok=0
        fi
        if ! printf '%s' "$line" | grep -q "\"check\":\"$check\""; then
            echo "check is not $check: $line"; ok=0
        fi
        if ! printf '%s' "$line" | grep -q "\"transport\":\"$transport\""; then
            echo "transport is not $transport: $line"; ok=0
        fi
        bytes=$(printf '%s' "$line" | sed -n 's/.*"bytes":\([0-9]*\),.*/\1/p')
        if [ -z "$bytes" ] || [ "$bytes" -lt "$min_bytes" ]; then
            echo "bytes '$bytes' < $min_bytes: $line"; ok=0
        fi
        # over rdma (the sim's two devices): both NICs carried bytes; else no NIC
        # (and asked grants); else no NIC and no grant
        if [ "$transport" = rdma ]; then
            if ! printf '%s' "$line" | grep -qE '"per_nic":\{"sim0":[1-9][0-9]*,"sim1":[1-9][0-9]*\}'; then
                echo "per_nic is not two NICs with bytes: $line"; ok=0
            fi
            if ! printf '%s' "$line" | grep -qE '"grants":[1-9][0-9]*\}$'; then
                echo "grants is not a positive count: $line"; ok=0
            fi
        elif ! printf '%s' "$line" | grep -q '"per_nic":{},"grants":0}'; then
            echo "per_nic is not empty or grants not 0: $line"; ok=0
        fi
        if printf '%s' "$line" | grep -qiE 'nan|inf'; then
            echo "non-finite number: $line"; ok=0
        fi
    done <"$TMP/$name.out"
    if [ "$n" -ne "$lines" ]; then
        echo "$n result lines, want $lines"; ok=0
    fi
    if [ "$ok" -eq 1 ]; then pass "$name"; else fail "$name"; cat "$TMP/$name.err"; fi
}

# shellcheck disable=SC2054  # "1,2" is one value: a --threads list
COMMON=(--total-bytes 1M --batch-size 3 --threads 1,2 --json --check)

# WRITE and READ, a page-sized and an odd block size, one and two threads: 4 lines each.
if run write_check 0 --op write --block-size 4K,4097 "${COMMON[@]}"; then
    json_ok write_check 4 ok 1048576
fi
if run read_check 0 --op read --block-size 4K,4097 "${COMMON[@]}"; then
    json_ok read_check 4 ok 1048576
fi

# With no --transport the bench takes the library's default list, shm,tcp (the JSON names the list).
if NO_TCP=1 run default_transport 0 --op write --block-size 4K --batch-size 4 --total-bytes 64K \
    --json --check; then
    json_ok default_transport 1 ok 65536 "shm,tcp"
fi

# Three batches in flight per thread, each on its own slots.
if run depth_check 0 --op write --block-size 8K --batch-size 4 --threads 2 --depth 3 \
    --total-bytes 2M --json --check; then
    json_ok depth_check 1 ok 2097152
fi
if run depth_read 0 --op read --block-size 8K --batch-size 4 --depth 3 --total-bytes 2M \
    --json --check; then
    json_ok depth_read 1 ok 2097152
fi

# One block bigger than the default slice (1M), so slicing is crossed.
if run write_big 0 --op write --block-size 3M --batch-size 2 --total-bytes 12M --json --check; then
    json_ok write_big 1 ok 12582912
fi

# The check must catch one wrong byte, for WRITE (checked by the target) and READ.
if run write_corrupt 1 --op write --block-size 4K --batch-size 4 --total-bytes 64K --json \
    --check --test-corrupt; then
    json_ok write_corrupt 1 failed 65536
fi
if run read_corrupt 1 --op read --block-size 4K --batch-size 4 --total-bytes 64K --json \
    --check --test-corrupt; then
    json_ok read_corrupt 1 failed 65536
fi

# Without --check the line says "off"; with --duration the run is time-bound. A worker
# claims a batch only before the duration ends (counted from when all workers were ready),
# so the duration must cover a worker thread's wake-up on a loaded machine: 5 s, not 1 s.
if run duration_off 0 --op read --block-size 64K --batch-size 8 --duration 5s --json; then
    json_ok duration_off 1 off 65536
fi

# The human table: a header with the latency unit, then one row per result.
# Files (--local-mem file:PATH: this engine's registration through the local segment, no
# target; --remote-mem file:PATH: the spawned target registers the file; served over tcp):
# --check compares the file's bytes, --test-corrupt must fail it.
if run file_local_write 0 --local-mem "file:$TMP/local.bin" --op write --block-size 4K,4097 \
    "${COMMON[@]}"; then
    json_ok file_local_write 4 ok 1048576
fi
if run file_local_read 0 --local-mem "file:$TMP/local.bin" --op read --block-size 4K,4097 \
    "${COMMON[@]}"; then
    json_ok file_local_read 4 ok 1048576
fi
if run file_local_corrupt 1 --local-mem "file:$TMP/local.bin" --op write --block-size 4K \
    --batch-size 4 --total-bytes 64K --json --check --test-corrupt; then
    json_ok file_local_corrupt 1 failed 65536
fi
if run file_remote_write 0 --remote-mem "file:$TMP/remote.bin" --op write --block-size 4K,1M \
    --batch-size 3 --total-bytes 4M --json --check; then
    json_ok file_remote_write 2 ok 4194304
fi
if run file_remote_read 0 --remote-mem "file:$TMP/remote.bin" --op read --block-size 4K,1M \
    --batch-size 3 --total-bytes 4M --json --check; then
    json_ok file_remote_read 2 ok 4194304
fi
if run file_remote_corrupt 1 --remote-mem "file:$TMP/remote.bin" --op read --block-size 4K \
    --batch-size 4 --total-bytes 64K --json --check --test-corrupt; then
    json_ok file_remote_corrupt 1 failed 65536
fi
if run file_remote_shm 0 --transport shm --remote-mem "file:$TMP/remote.bin" --op write \
    --block-size 4K,1M --batch-size 3 --total-bytes 4M --json --check; then
    json_ok file_remote_shm 2 ok 4194304 shm
fi
# --sweep: a WRITE of 8 MiB through a 128 KiB working set into a new (sparse) 4 MiB file
# allocates every block of it; without --sweep only the working set's.
kib() { du -k "$1" | cut -f1; }
if run file_nosweep 0 --local-mem "file:$TMP/nosweep.bin" --buffer-size 4M --op write \
    --block-size 64K --batch-size 2 --total-bytes 8M --json &&
    run file_sweep 0 --local-mem "file:$TMP/sweep.bin" --buffer-size 4M --op write \
        --block-size 64K --batch-size 2 --total-bytes 8M --json --sweep; then
    if [ "$(kib "$TMP/sweep.bin")" -ge 4096 ] && [ "$(kib "$TMP/nosweep.bin")" -lt 1024 ]; then
        json_ok file_sweep 1 off 8388608
    else
        fail "file_sweep: $(kib "$TMP/sweep.bin") KiB with --sweep, $(kib "$TMP/nosweep.bin") without"
    fi
fi

if run table 0 --op write --block-size 4K,8K --batch-size 2 --total-bytes 256K; then
    if grep -q 'latency per batch' "$TMP/table.out" && grep -q 'p99.9_us' "$TMP/table.out" &&
        [ "$(grep -c '^write ' "$TMP/table.out")" -eq 2 ]; then
        pass table
    else
        fail table; cat "$TMP/table.out"
    fi
fi

# --stats: after the results, the engine's counters (ote_engine_stats). With --json one
# more line, {"stats":{...}}, with its keys in order; its transport moved at least the
# results' bytes (warm-up batches come on top), nothing failed and nothing is in flight.
# In the table, the stats lines follow the rows.
STATS_KEYS="stats transports tcp peers submitted read write completed read write failed read write canceled read write timed_out read write bytes_read bytes_written inflight_requests inflight_bytes latency_ns_sum latency_us_log2 registrations registered_bytes registrations_total notify_sent notify_send_failed notify_received notify_refused auth_failures auth_backoff_refused auth_open_failures"
if run stats_json 0 --op write --block-size 64K --batch-size 4 --total-bytes 1M --json --check \
    --stats; then
    head -n -1 "$TMP/stats_json.out" >"$TMP/stats_results.out"
    json_ok stats_results 1 ok 1048576
    line=$(tail -n 1 "$TMP/stats_json.out")
    keys=$(printf '%s' "$line" | grep -o '"[a-z0-9_]*":' | tr -d '":' | tr '\n' ' ')
    written=$(printf '%s' "$line" | sed -n 's/.*"bytes_written":\([0-9]*\),.*/\1/p')
    if [ "${keys% }" = "$STATS_KEYS" ] && [ -n "$written" ] && [ "$written" -ge 1048576 ] &&
        printf '%s' "$line" | grep -q '"failed":{"read":0,"write":0}' &&
        printf '%s' "$line" | grep -q '"inflight_requests":0,"inflight_bytes":0' &&
        printf '%s' "$line" | grep -qE '"latency_us_log2":\[[0-9]+(,[0-9]+){31}\]'; then
        pass stats_json
    else
        fail stats_json; echo "keys '${keys% }'"; echo "$line"
    fi
fi
if run stats_table 0 --op read --block-size 4K --batch-size 2 --total-bytes 64K --stats; then
    if grep -q '^stats (this engine, whole run):' "$TMP/stats_table.out" &&
        grep -qE '^  tcp  peers 1; requests read ([0-9]+)/\1/0/0/0' "$TMP/stats_table.out"; then
        pass stats_table
    else
        fail stats_table; cat "$TMP/stats_table.out"
    fi
fi

# Host buffers on transparent huge pages (thp: 2 MiB-aligned, MADV_HUGEPAGE) and shared
# allocations (shared: ote_memory_alloc_shared, which the target's source maps and copies
# through) over shm, a page-sized, an odd and a multi-MiB block: checked, named.
for mem in thp shared; do
    for op in write read; do
        t="${mem}_$op"
        if run "$t" 0 --transport shm --op "$op" --local-mem "$mem" --remote-mem "$mem" \
            --block-size 4097,3M --batch-size 2 --total-bytes 12M --json --check; then
            json_ok "$t" 2 ok 12582912 shm
            if [ "$(grep -c "\"local_mem\":\"$mem\",\"remote_mem\":\"$mem\",\"path\":\"host\"" "$TMP/$t.out")" -eq 2 ]; then
                pass "$t memories"
            else
                fail "$t memories"; cat "$TMP/$t.out"
            fi
        fi
    done
done

# The RDMA path over the software verbs provider: both engines use transport=rdma, every
# byte goes through a memory window granted by the target, and the check still holds.
export OTE_VERBS_PROVIDER=sim
if run rdma_write 0 --transport rdma --op write --block-size 4K,1M --batch-size 4 \
    --total-bytes 8M --json --check; then
    json_ok rdma_write 2 ok 8388608 rdma
fi
if run rdma_read 0 --transport rdma --op read --block-size 4097,1M --batch-size 4 \
    --total-bytes 8M --json --check; then
    json_ok rdma_read 2 ok 8388608 rdma
fi
if run rdma_corrupt 1 --transport rdma --op read --block-size 4K --batch-size 4 \
    --total-bytes 64K --json --check --test-corrupt; then
    json_ok rdma_corrupt 1 failed 65536 rdma
fi
unset OTE_VERBS_PROVIDER

# Device memory over the fake libcuda: every pair of memories, WRITE and READ, checked
# through device-to-host copies (6 MiB per block size: one batch of two 3 MiB blocks, so
# a block still spans several slices; the fake driver's copies are slow, so no more);
# the JSON names the memories and the path. A corrupted
# byte in device memory is caught too, and a missing driver is a clear failure.
export OTE_CUDA_LIBRARY
OTE_CUDA_LIBRARY="$(cd "$(dirname "$FAKE_CUDA")" && pwd)/$(basename "$FAKE_CUDA")"
# mem_ok NAME LOCAL REMOTE PATH: every line names those memories and that path.
mem_ok() {
    if [ "$(grep -c "\"local_mem\":\"$2\",\"remote_mem\":\"$3\",\"path\":\"$4\"" "$TMP/$1.out")" -eq \
        "$(wc -l <"$TMP/$1.out")" ]; then
        pass "$1 memories"
    else
        fail "$1 memories"; cat "$TMP/$1.out"
    fi
}
for spec in "cuda:0 host" "host cuda:0" "cuda:0 cuda:0"; do
    read -r LM RM <<<"$spec"
    for op in write read; do
        name="gpu_${op}_${LM/:/}_${RM/:/}"
        if run "$name" 0 --op "$op" --local-mem "$LM" --remote-mem "$RM" --block-size 4097,3M \
            --batch-size 2 --total-bytes 6M --json --check; then
            json_ok "$name" 2 ok 6291456
            mem_ok "$name" "$LM" "$RM" staging
        fi
    done
done
if run gpu_shm 0 --transport shm --op read --local-mem cuda:0 --remote-mem cuda:0 \
    --block-size 1M --batch-size 4 --total-bytes 8M --json --check; then
    json_ok gpu_shm 1 ok 8388608 shm
    mem_ok gpu_shm cuda:0 cuda:0 staging
fi
# CUDA IPC over shm: the target's device buffer opted in (--remote-ipc), ipc allowed on
# both sides: the JSON says the path was ipc for a local device buffer; an initiator
# whose buffer is host memory never loads the CUDA driver, so it cannot import and the
# target stages (path staging).
for LM in cuda:0 host; do
    want=ipc
    [ "$LM" = host ] && want=staging
    for op in write read; do
        name="gpu_ipc_${op}_${LM/:/}"
        if OTE_GPU_PATHS=ipc,staging run "$name" 0 --transport shm --op "$op" --local-mem "$LM" \
            --remote-mem cuda:0 --remote-ipc --block-size 4097,1M --batch-size 2 \
            --total-bytes 4M --json --check; then
            json_ok "$name" 2 ok 4194304 shm
            mem_ok "$name" "$LM" cuda:0 "$want"
        fi
    done
done
# GPUDirect RDMA over the software verbs provider: the initiator's device buffer gets
# dma-buf MRs (direct in gpu_paths) and moves with no staging: the JSON says direct.
for op in write read; do
    name="gpu_direct_${op}"
    if OTE_VERBS_PROVIDER=sim OTE_GPU_PATHS=direct,staging run "$name" 0 --transport rdma \
        --op "$op" --local-mem cuda:0 --block-size 4097,1M --batch-size 2 --total-bytes 4M \
        --json --check; then
        json_ok "$name" 2 ok 4194304 rdma
        mem_ok "$name" cuda:0 host direct
    fi
done
if run gpu_corrupt 1 --op read --local-mem cuda:0 --block-size 4K --batch-size 4 \
    --total-bytes 64K --json --check --test-corrupt; then
    json_ok gpu_corrupt 1 failed 65536
fi
if run host_path 0 --op write --block-size 64K --batch-size 2 --total-bytes 256K --json; then
    mem_ok host_path host host host
fi
if OTE_CUDA_LIBRARY=/nonexistent/libcuda.so.1 run gpu_no_driver 1 --local-mem cuda:0 \
    --block-size 4K --total-bytes 4K --json; then
    if grep -q 'OTE_ERR_NO_DEVICE' "$TMP/gpu_no_driver.err"; then
        pass gpu_no_driver
    else
        fail gpu_no_driver; cat "$TMP/gpu_no_driver.err"
    fi
fi
unset OTE_CUDA_LIBRARY

# Two processes: a target started on its own (--role target) and an initiator that names
# it (--target), once asking it for its buffer (and checking every byte), once given the
# buffer on the command line (--remote-addr/--remote-len, no control requests). The
# target's report line is awaited for at most 30 s; SIGTERM ends it, within 30 s.
timeout -k 5 300 "$BENCH" --role target --listen 127.0.0.1:0 --buffer-size 16M \
    >"$TMP/target.out" 2>"$TMP/target.err" &
TARGET_PID=$!
REPORT=""
for _ in $(seq 300); do
    REPORT="$(grep -m1 '^OTEB1 TARGET ' "$TMP/target.out" 2>/dev/null)"
    [ -n "$REPORT" ] && break
    kill -0 "$TARGET_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$REPORT" ]; then
    fail "target_role: no report line"; cat "$TMP/target.out" "$TMP/target.err"
else
    # OTEB1 TARGET <host:port> <buffer address> <length>
    read -r _ _ T_ADDR T_BUF T_LEN <<<"$REPORT"
    if run named_target 0 --target "$T_ADDR" --op write --block-size 4K,64K --batch-size 4 \
        --total-bytes 1M --json --check; then
        json_ok named_target 2 ok 1048576
    fi
    if run remote_given 0 --target "$T_ADDR" --remote-addr "$T_BUF" --remote-len "$T_LEN" \
        --op read --block-size 64K --batch-size 4 --total-bytes 1M --json; then
        json_ok remote_given 1 off 1048576
    fi
fi
kill -TERM "$TARGET_PID" 2>/dev/null
T_RC=0
for _ in $(seq 300); do
    kill -0 "$TARGET_PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$TARGET_PID" 2>/dev/null; then
    kill -KILL "$TARGET_PID" 2>/dev/null
    fail "target_role: did not stop within 30 s of SIGTERM"
fi
wait "$TARGET_PID" 2>/dev/null || T_RC=$?
if [ -n "$REPORT" ]; then
    if [ "$T_RC" -eq 0 ]; then pass target_role; else fail "target_role: exit status $T_RC"; cat "$TMP/target.err"; fi
fi

# Bad usage: exit status 2 and a message naming the option.
if run bad_usage 2 --block-size 0; then
    if grep -q -- '--block-size: 0 is out of range' "$TMP/bad_usage.err"; then
        pass bad_usage
    else
        fail bad_usage; cat "$TMP/bad_usage.err"
    fi
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
