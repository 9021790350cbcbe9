#!/bin/bash
# tools/file_vs_mem.sh, run small (32 MiB, 1 s per run, one round, tcp and shm): it must
# exit 0 and print one line per transport with the memory READ rate, the file READ rate
# (zero copy) and the bounced file READ rate with their ratios, every figure a positive
# number. Correctness only: no rate or ratio is asserted (the machine is shared and
# noisy; tools/file_vs_mem.sh is the benchmark). Also: an unknown argument and a
# transport other than tcp and shm exit 2. A given --file is grown to --size and kept, and
# --reread (its cached pages dropped first) measures it the same way.
#
# Usage (from Bazel): file_vs_mem_test.sh <tools/file_vs_mem.sh> <ote_bench>
set -u
SCRIPT="${1:?usage: $0 <file_vs_mem.sh> <ote_bench>}"
BENCH="${2:?usage: $0 <file_vs_mem.sh> <ote_bench>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
FAILED=0
fail() { FAILED=1; echo "FAIL: $1"; }

TMPDIR="$TMP" timeout 120 "$SCRIPT" --ote-bench "$BENCH" --size 32M --runtime 1 --rounds 1 \
    >"$TMP/out" 2>"$TMP/err"
rc=$?
cat "$TMP/out"
[ "$rc" = 0 ] || { fail "exit status $rc"; cat "$TMP/err"; }
num='[0-9]+\.[0-9]+'
for t in tcp shm; do
    line=$(grep -E "^file_vs_mem: round 1 $t +memory $num  file $num \(${num}x\)  file, bounced $num \(${num}x\) GB/s$" "$TMP/out")
    if [ -z "$line" ]; then fail "no line for $t"; continue; fi
    echo "$line" | tr -d '()x' | awk '{ for (i = 6; i <= NF - 1; i++) if ($i !~ /^[a-z,]+$/ && $i <= 0) exit 1 }' ||
        fail "$t: a zero rate or ratio: $line"
done
[ -z "$(ls "$TMP" | grep '^file_vs_mem\.')" ] || fail "its temporary file was left behind"

: >"$TMP/given"
timeout 120 "$SCRIPT" --ote-bench "$BENCH" --file "$TMP/given" --reread --transports tcp \
    --size 32M --runtime 1 --rounds 1 >"$TMP/out2" 2>"$TMP/err2" || { fail "--reread: exit status $?"; cat "$TMP/err2"; }
cat "$TMP/out2"
grep -qE "^file_vs_mem: round 1 tcp +memory $num  file $num \(${num}x\)" "$TMP/out2" || fail "--reread: no line for tcp"
[ "$(stat -c %s "$TMP/given" 2>/dev/null)" = $((32 << 20)) ] || fail "the given file was not grown to 32 MiB and kept"

"$SCRIPT" --ote-bench "$BENCH" --bogus >/dev/null 2>&1
[ $? = 2 ] || fail "an unknown argument did not exit 2"
"$SCRIPT" --ote-bench "$BENCH" --transports rdma >/dev/null 2>&1
[ $? = 2 ] || fail "--transports rdma did not exit 2"

[ "$FAILED" = 0 ] && echo "PASS"
exit "$FAILED"
