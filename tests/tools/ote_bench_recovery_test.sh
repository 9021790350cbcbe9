#!/bin/bash
# ote_bench --check across the faults the RDMA monitor recovers from (issue 26 part 3):
# --inject cq_error=N,gid_change=M makes the initiator's verbs/sim break the CQ of its Nth
# completion (a CQ lane error, with work on that lane) and renumber its port's GIDs at the
# Mth (a route change), in the middle of the run. For WRITE and READ of 64 KiB blocks
# (64 MiB, so about a thousand completions): the run must end with exit status 0 and one
# JSON line with check "ok" (every byte right, batches the device failed resubmitted by
# the bench), and the log must show that both faults happened and were recovered: the
# lane replaced, the old route's QPs fenced. Without the engine's recovery the run fails
# (a batch ends at its deadline, or on a peer's loss it was not).
#
# Usage (from Bazel): ote_bench_recovery_test.sh <ote_bench>. A correctness test with fixed
# sizes, bounded by `timeout`, never a timed one.
set -u

BENCH="${1:?usage: $0 <ote_bench>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); echo "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $1"; }

export OTE_VERBS_PROVIDER=sim OTE_LOG_LEVEL=info
unset OTE_SIM_INJECT

run_case() {
    local op="$1" rc=0 why=""
    timeout -k 5 120 "$BENCH" --no-progress --transport rdma --op "$op" --block-size 64K \
        --batch-size 4 --total-bytes 64M --json --check --inject cq_error=200,gid_change=700 \
        >"$TMP/$op.out" 2>"$TMP/$op.err" || rc=$?
    [ "$rc" -eq 0 ] || why="exit status $rc"
    [ "$(wc -l <"$TMP/$op.out")" -eq 1 ] || why="$why; not 1 result line"
    grep -q '"op":"'"$op"'","block_size":65536,.*"bytes":67108864,.*"check":"ok"' "$TMP/$op.out" ||
        why="$why; no checked line of 64 MiB"
    grep -q 'OTE_SIM_INJECT: CQ error after' "$TMP/$op.err" || why="$why; no CQ error injected"
    grep -Eq 'CQ lane [0-9]+ replaced after OTE_ERR_FENCED' "$TMP/$op.err" ||
        why="$why; no lane replaced"
    grep -q 'OTE_SIM_INJECT: sim[0-9] port 1 GID index 3 changed: OTE_OK' "$TMP/$op.err" ||
        why="$why; no GID change injected"
    grep -q 'route changed (generation' "$TMP/$op.err" || why="$why; no route change seen"
    if [ -z "$why" ]; then
        pass "$op across a lane error and a route change"
        grep -E 'resubmitted|replaced after|route changed' "$TMP/$op.err"
    else
        fail "$op: ${why#; }"
        echo "--- stdout"; cat "$TMP/$op.out"
        echo "--- stderr (last 40 lines, debug left out)"
        grep -v '^orbitte D ' "$TMP/$op.err" | tail -40
    fi
}

run_case write
run_case read

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
