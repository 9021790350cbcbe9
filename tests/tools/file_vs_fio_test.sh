#!/bin/bash
# tools/file_vs_fio.sh, run small (a 64 MiB file, 1 s per measurement, queue depth 4): it
# must exit 0 and print one line per direction with fio's rate, ote_bench's rate and
# their ratio, and (--peer shm) one with a shm peer's rate against the file and its ratio,
# every figure a positive number. Correctness only: no rate or ratio is
# asserted (the machine is shared and noisy; tools/file_vs_fio.sh is the benchmark).
# Also: an unknown argument, a queue depth out of range and an unknown --peer exit 2.
#
# Usage (from Bazel): file_vs_fio_test.sh <tools/file_vs_fio.sh> <ote_bench>
set -u
SCRIPT="${1:?usage: $0 <file_vs_fio.sh> <ote_bench>}"
BENCH="${2:?usage: $0 <file_vs_fio.sh> <ote_bench>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
FAILED=0
fail() { FAILED=1; echo "FAIL: $1"; }

TMPDIR="$TMP" timeout 120 "$SCRIPT" --ote-bench "$BENCH" --size 64M --qd 4 --runtime 1 \
    --peer shm >"$TMP/out" 2>"$TMP/err"
rc=$?
cat "$TMP/out"
[ "$rc" = 0 ] || { fail "exit status $rc"; cat "$TMP/err"; }
for op in read write; do
    line=$(grep -E "^file_vs_fio: $op +fio [0-9.]+ GB/s  ote_bench [0-9.]+ GB/s  ratio [0-9.]+$" "$TMP/out")
    if [ -z "$line" ]; then fail "no ratio line for $op"; continue; fi
    # Each figure above zero (both sides moved bytes).
    echo "$line" | awk '{ if ($4 <= 0 || $7 <= 0 || $10 <= 0) exit 1 }' ||
        fail "$op: a zero rate or ratio: $line"
    line=$(grep -E "^file_vs_fio: $op +fio [0-9.]+ GB/s  peer over shm [0-9.]+ GB/s  ratio [0-9.]+$" "$TMP/out")
    if [ -z "$line" ]; then fail "no peer line for $op"; continue; fi
    echo "$line" | awk '{ if ($4 <= 0 || $9 <= 0 || $12 <= 0) exit 1 }' ||
        fail "$op: a zero peer rate or ratio: $line"
done
[ -z "$(ls "$TMP" | grep '^file_vs_fio\.')" ] || fail "its temporary directory was left behind"

"$SCRIPT" --ote-bench "$BENCH" --bogus >/dev/null 2>&1
[ $? = 2 ] || fail "an unknown argument did not exit 2"
"$SCRIPT" --ote-bench "$BENCH" --qd 17 >/dev/null 2>&1
[ $? = 2 ] || fail "--qd 17 did not exit 2"
"$SCRIPT" --ote-bench "$BENCH" --peer rdma >/dev/null 2>&1
[ $? = 2 ] || fail "--peer rdma did not exit 2"

[ "$FAILED" = 0 ] && echo "PASS"
exit "$FAILED"
