#!/bin/bash
# ote_bench --transport rdma --check under one verbs/sim device profile (issue 25): WRITE
# and READ, 4 KiB blocks (1,024 of them) and a 64 MiB block, host memory on both sides, device memory (the fake
# libcuda) at the initiator (GPUDirect: path direct) and at the target. Every run checks
# every byte, must print one JSON line per block size with check "ok", and must say in
# its log that the engines saw the profile's device (its max_qp_wr, or for nomw that host
# memory is granted by exact MRs): a run on the wrong device would prove nothing.
#
# Usage (from Bazel): ote_bench_profiles_test.sh <ote_bench> <libfake_cuda.so> <profile>
# (mlx5, rxe, nomw or small). Each run is bounded by `timeout`; it is a correctness test
# with fixed sizes, never a timed one.
set -u

BENCH="${1:?usage: $0 <ote_bench> <libfake_cuda.so> <profile>}"
FAKE_CUDA="${2:?usage: $0 <ote_bench> <libfake_cuda.so> <profile>}"
PROFILE="${3:?usage: $0 <ote_bench> <libfake_cuda.so> <profile>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); echo "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $1"; }

# What the context layer logs (debug) for the profile's devices, and for nomw the
# transport's choice of grants (info).
case "$PROFILE" in
    mlx5) SIGN='device sim0: max_qp_wr 32768, .*mw type 2 yes, scatter-to-CQE on' ;;
    rxe) SIGN='device sim0: max_qp_wr 16384, .*mw type 2 yes, scatter-to-CQE off' ;;
    nomw) SIGN='host memory is granted by exact MRs, one per grant' ;;
    small) SIGN='device sim0: max_qp_wr 512, .*mw type 2 yes, scatter-to-CQE off' ;;
    *) echo "unknown profile $PROFILE"; exit 2 ;;
esac

export OTE_VERBS_PROVIDER=sim OTE_SIM_PROFILE="$PROFILE" OTE_LOG_LEVEL=debug
export OTE_GPU_PATHS=direct,staging OTE_CUDA_LIBRARY
OTE_CUDA_LIBRARY="$(cd "$(dirname "$FAKE_CUDA")" && pwd)/$(basename "$FAKE_CUDA")"

# case NAME OP LOCAL REMOTE PATH: 4 KiB blocks (4 MiB of them: 1,024 requests) and one
# 64 MiB block, checked; one JSON line each with check ok, those memories and that path;
# the profile's device named in the log.
run_case() {
    local name="$1" op="$2" lm="$3" rm="$4" path="$5" rc=0 why=""
    : >"$TMP/$name.out"
    : >"$TMP/$name.err"
    for shape in "4K 4M" "64M 64M"; do
        read -r bs total <<<"$shape"
        timeout -k 5 180 "$BENCH" --no-progress --transport rdma --op "$op" --local-mem "$lm" \
            --remote-mem "$rm" --block-size "$bs" --batch-size 1 --total-bytes "$total" \
            --json --check >>"$TMP/$name.out" 2>>"$TMP/$name.err" || rc=$?
    done
    [ "$rc" -eq 0 ] || why="exit status $rc"
    [ "$(wc -l <"$TMP/$name.out")" -eq 2 ] || why="$why; not 2 result lines"
    [ "$(grep -c '"transport":"rdma","op":"'"$op"'","block_size":4096,.*"bytes":4194304,.*"check":"ok"' "$TMP/$name.out")" -eq 1 ] ||
        why="$why; no checked line of 4 KiB blocks (4 MiB)"
    [ "$(grep -c '"transport":"rdma","op":"'"$op"'","block_size":67108864,.*"bytes":67108864,.*"check":"ok"' "$TMP/$name.out")" -eq 1 ] ||
        why="$why; no checked line of a 64 MiB block"
    [ "$(grep -c "\"local_mem\":\"$lm\",\"remote_mem\":\"$rm\",\"path\":\"$path\"" \
        "$TMP/$name.out")" -eq 2 ] || why="$why; memories or path not $lm $rm $path"
    grep -q "$SIGN" "$TMP/$name.err" || why="$why; the log does not show the $PROFILE device"
    if [ -z "$why" ]; then
        pass "$PROFILE $name"
    else
        fail "$PROFILE $name: ${why#; }"
        echo "--- stdout"; cat "$TMP/$name.out"
        echo "--- stderr (last 30 lines, verbs debug left out)"
        grep -v '^orbitte D \[verbs' "$TMP/$name.err" | tail -30
    fi
}

for op in write read; do
    run_case "host_$op" "$op" host host host
    run_case "gpu_local_$op" "$op" cuda:0 host direct
    run_case "gpu_remote_$op" "$op" host cuda:0 staging
done

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
