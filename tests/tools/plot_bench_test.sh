#!/bin/bash
# tools/plot_bench.py over a real ote_bench sweep: ote_bench --json sweeps three block
# sizes over tcp and over shm (a short --total-bytes each), plot_bench.py draws both into
# one PNG of a requested size, and the PNG must exist, be non-empty, be a PNG and have
# exactly that width and height (read from its IHDR chunk). A file without result lines
# must be refused (exit 1, nothing written). Then ote_bench's progress line: on a
# terminal (script(1) gives it one) a run over 2 s shows "[ote_bench] ... GB/s" on
# stderr, a run under 2 s and a run with --no-progress do not.
#
# Usage (from Bazel): plot_bench_test.sh <path to ote_bench> <path to plot_bench.py>
set -u

BENCH="${1:?usage: $0 <ote_bench> <plot_bench.py>}"
PLOT="${2:?usage: $0 <ote_bench> <plot_bench.py>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
export MPLCONFIGDIR="$TMP/mpl" # matplotlib's cache, writable
PY=/usr/bin/python3            # Debian's, with python3-matplotlib (scripts/deps.sh)
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS: $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $1"; }

# The sweep: 4K, 64K and 1M blocks, 8 MiB each, over tcp and shm.
for t in tcp shm; do
    if timeout -k 5 120 "$BENCH" --no-progress --transport "$t" --op write -b 4K,64K,1M -n 8M \
        --json >"$TMP/$t.json" 2>"$TMP/$t.err" && [ "$(grep -c '^{' "$TMP/$t.json")" -eq 3 ]; then
        pass "ote_bench --transport $t sweep: 3 JSON lines"
    else
        fail "ote_bench --transport $t sweep"; cat "$TMP/$t.json" "$TMP/$t.err"
    fi
done

if "$PY" "$PLOT" "$TMP/tcp.json" "$TMP/shm.json" -o "$TMP/sweep.png" --size 640x480 \
    --title "plot_bench_test" 2>"$TMP/plot.err"; then
    pass "plot_bench.py exits 0"
else
    fail "plot_bench.py failed"; cat "$TMP/plot.err"
fi
# width and height: big-endian 32-bit integers at bytes 16 and 20 of a PNG (IHDR)
dims=$("$PY" - "$TMP/sweep.png" <<'PYEOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
print("%dx%d %d" % (struct.unpack(">II", data[16:24]) + (len(data),)))
PYEOF
)
case "$dims" in
    "640x480 "*) [ "${dims#* }" -gt 1000 ] && pass "PNG of 640x480, ${dims#* } bytes" ||
        fail "PNG too small to hold the plots: $dims" ;;
    *) fail "PNG: '$dims', want 640x480" ;;
esac

echo "no result here" >"$TMP/empty.json"
"$PY" "$PLOT" "$TMP/empty.json" -o "$TMP/empty.png" 2>"$TMP/empty.err"
rc=$?
if [ "$rc" -eq 1 ] && [ ! -e "$TMP/empty.png" ] && grep -q "no ote_bench --json result" "$TMP/empty.err"; then
    pass "an input without results is refused"
else
    fail "an input without results: exit $rc"; cat "$TMP/empty.err"
fi

# progress NAME WANT ARGS...: ote_bench on a pseudo-terminal (script -q -c), its stderr
# (and stdout) in $TMP/NAME.tty; WANT 1: a progress line must be there, 0: must not.
progress() {
    local name="$1" want="$2" cmd q
    shift 2
    cmd=$(printf '%q ' "$BENCH" --transport tcp --op write -b 64K "$@")
    timeout -k 5 60 script -q -e -c "$cmd" "$TMP/$name.tty" >/dev/null 2>&1 </dev/null
    local rc=$?
    q=0
    grep -aq '\[ote_bench\] write 64K x[0-9]* t1: .* GB/s' "$TMP/$name.tty" && q=1
    if [ "$rc" -eq 0 ] && [ "$q" -eq "$want" ]; then
        pass "progress line on a terminal, $name: $([ "$want" = 1 ] && echo shown || echo not shown)"
    else
        fail "progress line, $name: exit $rc, shown $q, want $want"; cat -v "$TMP/$name.tty" | tail -5
    fi
}
if command -v script >/dev/null; then
    progress long 1 -d 3s
    progress short 0 -d 1s
    progress disabled 0 -d 3s --no-progress
else
    fail "script(1) (util-linux) is missing: the progress line cannot be put on a terminal"
fi

echo "plot_bench_test: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
