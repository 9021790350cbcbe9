#!/usr/bin/env bash
# scripts/gpu_check.sh - proves the cuda/ owners on a machine with an NVIDIA GPU: runs the
# cuda tests (tests/cuda: driver, memory, pinned, stream, ipc, fault) against the REAL
# libcuda (OTE_TEST_REAL_CUDA=1; the fake-only cases skip with their reason), checks
# cuda/driver.h against the machine's cuda.h, then a short bandwidth probe (HtoD, DtoH,
# DtoD of 256 MiB through the owners vs cuMemcpy directly; GB/s and ratios).
#
#   scripts/gpu_check.sh                  bazel here: build, then run everything
#   scripts/gpu_check.sh --package DIR    build here with bazel and put the test binaries,
#                                         the probe, the fake libcuda, the sources the
#                                         fallbacks need and this script into DIR
#   DIR/gpu_check.sh --prebuilt DIR       run from a package on a machine without bazel
#   (also: scripts/gpu_check.sh --prebuilt DIR)
#
# Options: --fake          use the fake libcuda of the build/package instead of the real
#                          driver (to check this script on a machine without a GPU; the
#                          fake's control API is then present, so fake-only cases run too)
#          --probe-size S  bytes per probe copy (default 256M); --probe-iters N (default 5)
#          --skip-tests / --skip-probe
# Environment: OTE_CUDA_LIBRARY (driver to load instead of libcuda.so.1), BAZEL (default
#   bazel), BAZEL_STARTUP (startup options, e.g. --output_base=...), OUT (when set, a
#   summary is written to $OUT/gpu_check_summary.txt and the logs to $OUT/gpu_check_logs/).
#
# Exit status: 0 every check passed; 1 something failed; 2 no GPU here (no loadable CUDA
# driver or no device: prints "no GPU: <reason>" and runs nothing); 64 usage error.
# Each test binary runs under a 150 s timeout and the probe under 180 s; a healthy run
# takes about a minute of tests plus well under a minute of probe.
set -u
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
TESTS=(driver_test memory_test pinned_test stream_test ipc_test fault_test)
MODE=bazel PKG="" USE_FAKE=0 PROBE_SIZE=256M PROBE_ITERS=5 SKIP_TESTS=0 SKIP_PROBE=0
EXIT_NO_GPU=2

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 64; }
while [ $# -gt 0 ]; do
    case "$1" in
        --package) MODE=package PKG=${2:-}; shift 2 || usage ;;
        --prebuilt) MODE=prebuilt PKG=${2:-}; shift 2 || usage ;;
        --fake) USE_FAKE=1; shift ;;
        --probe-size) PROBE_SIZE=${2:-}; shift 2 || usage ;;
        --probe-iters) PROBE_ITERS=${2:-}; shift 2 || usage ;;
        --skip-tests) SKIP_TESTS=1; shift ;;
        --skip-probe) SKIP_PROBE=1; shift ;;
        -h | --help) usage ;;
        *) echo "gpu_check: unknown argument $1" >&2; usage ;;
    esac
done
if [ "$MODE" != bazel ] && [ -z "$PKG" ]; then echo "gpu_check: $MODE needs a directory" >&2; exit 64; fi

BAZEL=${BAZEL:-bazel}
read -r -a BSTART <<<"${BAZEL_STARTUP:-}"
BUILD_TARGETS=()
for t in "${TESTS[@]}"; do BUILD_TARGETS+=("//tests/cuda:$t"); done
BUILD_TARGETS+=(//tests/cuda:bw_probe //tests/cuda:libfake_cuda.so)

bazel_build() { # extra build flags...
    local root
    root=$(cd "$SELF_DIR/.." && pwd)
    (cd "$root" && "$BAZEL" "${BSTART[@]}" build "$@" "${BUILD_TARGETS[@]}") || return 1
    BIN=$(cd "$root" && "$BAZEL" "${BSTART[@]}" info "$@" bazel-bin 2>/dev/null)/tests/cuda
    SRC_ROOT=$root
}

# ---- --package: build here, copy what the GPU machine needs ----
if [ "$MODE" = package ]; then
    command -v "$BAZEL" >/dev/null || { echo "gpu_check: --package needs bazel"; exit 1; }
    # Our libraries linked in (not as the test-only shared objects bazel uses by
    # default), libstdc++/libgcc statically: the binaries depend on glibc only.
    bazel_build --dynamic_mode=off --linkopt=-static-libstdc++ --linkopt=-static-libgcc || { echo "gpu_check: build failed"; exit 1; }
    mkdir -p "$PKG/bin" "$PKG/lib" "$PKG/src" || exit 1
    for t in "${TESTS[@]}" bw_probe; do install -m 755 "$BIN/$t" "$PKG/bin/$t" || exit 1; done
    install -m 755 "$BIN/libfake_cuda.so" "$PKG/lib/libfake_cuda.so" || exit 1
    # Sources for the fallbacks: the header check, and rebuilding the probe with gcc when
    # the prebuilt binaries do not run on the GPU machine's libc.
    # (base's headers include the public status header of the engine's API.)
    (cd "$SRC_ROOT" && tar -cf - base/*.c base/*.h cuda/*.c cuda/*.h cuda/*/*.c cuda/*/*.h \
        $(ls engine/include/ote/*.h 2>/dev/null) tests/cuda/header_check.cc tests/cuda/bw_probe.c scripts/cuda_facts.c) |
        tar -xf - -C "$PKG/src" || exit 1
    for h in uthash.h utlist.h; do [ -f "/usr/include/$h" ] && cp "/usr/include/$h" "$PKG/src/"; done
    install -m 755 "$SELF_DIR/gpu_check.sh" "$PKG/gpu_check.sh" || exit 1
    (cd "$SRC_ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown) >"$PKG/REVISION"
    echo "gpu_check: package ready in $PKG ($(du -sh "$PKG" | cut -f1)); on the GPU machine run:"
    echo "    $PKG/gpu_check.sh --prebuilt $PKG"
    exit 0
fi

# ---- run (bazel or prebuilt) ----
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT
SUMMARY=()
PASSED=0 FAILED=0 SKIPPED=0
note() { echo "$*"; SUMMARY+=("$*"); }
finish() { # exit code
    note "gpu_check: $PASSED passed, $FAILED failed, $SKIPPED skipped"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/gpu_check_logs" && cp "$LOGDIR"/* "$OUT/gpu_check_logs/" 2>/dev/null
        printf '%s\n' "${SUMMARY[@]}" >"$OUT/gpu_check_summary.txt"
    fi
    exit "$1"
}

if [ "$MODE" = bazel ]; then
    command -v "$BAZEL" >/dev/null || {
        echo "gpu_check: no bazel here; build a package elsewhere (--package DIR) and run --prebuilt DIR"
        exit 64
    }
    bazel_build || { note "FAIL: bazel build of the cuda tests"; FAILED=1; finish 1; }
    BINDIR=$BIN FAKELIB=$BIN/libfake_cuda.so SRCDIR=$SRC_ROOT
else
    PKG=$(cd "$PKG" && pwd) || exit 64
    BINDIR=$PKG/bin FAKELIB=$PKG/lib/libfake_cuda.so SRCDIR=$PKG/src
    [ -f "$PKG/REVISION" ] && note "package built from revision $(cat "$PKG/REVISION")"
fi

if [ "$USE_FAKE" = 1 ]; then
    export OTE_CUDA_LIBRARY=$FAKELIB
    note "driver: the FAKE libcuda ($FAKELIB) -- this checks the script, not a GPU"
fi
DRIVER=${OTE_CUDA_LIBRARY:-libcuda.so.1}

# Is there a driver with a device? python3 (ctypes) asks it directly; without python3 the
# probe's own check (exit 2) decides.
gpu_reason=""
if command -v python3 >/dev/null; then
    gpu_reason=$(python3 - "$DRIVER" <<'PY'
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as e:
    print("cannot load the CUDA driver %s: %s" % (sys.argv[1], e)); sys.exit(0)
r = lib.cuInit(0)
if r != 0:
    print("cuInit failed with CUresult %d (no device, or the driver is not usable)" % r); sys.exit(0)
n = ctypes.c_int(0)
r = lib.cuDeviceGetCount(ctypes.byref(n))
if r != 0 or n.value < 1:
    print("the driver reports no device (CUresult %d, count %d)" % (r, n.value)); sys.exit(0)
PY
)
elif [ "$DRIVER" = libcuda.so.1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    gpu_reason="libcuda.so.1 is not installed"
fi
if [ -n "$gpu_reason" ]; then
    note "no GPU: $gpu_reason"
    [ -n "${OUT:-}" ] && mkdir -p "$OUT" && printf '%s\n' "${SUMMARY[@]}" >"$OUT/gpu_check_summary.txt"
    exit $EXIT_NO_GPU
fi
command -v nvidia-smi >/dev/null && [ "$USE_FAKE" = 0 ] &&
    note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
note "driver library: $DRIVER; binaries: $BINDIR"

runs_here() { # binary: 0 when it can start on this machine's libc
    local out
    out=$("$1" --gtest_list_tests 2>&1 >/dev/null | head -3)
    case "$out" in *GLIBC*|*"not found"*|*"cannot execute"*) return 1 ;; esac
    return 0
}

# ---- the tests, against the real driver ----
if [ "$SKIP_TESTS" = 0 ]; then
    for t in "${TESTS[@]}"; do
        log="$LOGDIR/$t.log"
        if ! runs_here "$BINDIR/$t"; then
            note "FAIL: $t does not run on this machine: $("$BINDIR/$t" --gtest_list_tests 2>&1 | head -1)"
            FAILED=$((FAILED + 1)); continue
        fi
        start=$(date +%s)
        OTE_TEST_REAL_CUDA=1 timeout -k 5 150 "$BINDIR/$t" --gtest_color=no >"$log" 2>&1
        rc=$?
        secs=$(($(date +%s) - start))
        p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
        s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
        f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
        p=${p:-0} s=${s:-0} f=${f:-0}
        [ $rc -ne 0 ] && [ "$f" = 0 ] && f=1 # crash or timeout
        PASSED=$((PASSED + p)) SKIPPED=$((SKIPPED + s)) FAILED=$((FAILED + f))
        if [ $rc -eq 0 ]; then
            note "PASS: $t ($p passed, $s skipped, ${secs}s)"
        else
            note "FAIL: $t (exit $rc$([ $rc -eq 124 ] && echo ', timed out'), $p passed, $f failed, ${secs}s)"
            grep -E '^\[  FAILED  \]|Failure|error:|Expected|Which is|actual' "$log" | head -40 | sed 's/^/    /'
            while IFS= read -r l; do SUMMARY+=("    $l"); done < <(grep -E '^\[  FAILED  \]|Failure' "$log" | head -20)
            tail -5 "$log" | sed 's/^/    | /'
        fi
        grep '^\[  SKIPPED \] [A-Za-z]' "$log" >/dev/null &&
            grep -B1 -E '^\[  SKIPPED \] [A-Za-z]' "$log" | grep -i 'skipped' | head -3 | sed 's/^/    /'
    done
    # cuda/driver.h against this machine's cuda.h
    inc=""
    for d in "${CUDA_HOME:-}/include" /usr/local/cuda/include /usr/include; do
        [ -f "$d/cuda.h" ] && { inc=$d; break; }
    done
    cxx=$(command -v g++ || command -v clang++ || true)
    if [ -n "$inc" ] && [ -n "$cxx" ] && [ -f "$SRCDIR/tests/cuda/header_check.cc" ]; then
        if (cd "$SRCDIR" && "$cxx" -std=c++17 -fsyntax-only -Wall -Werror -I. -isystem "$inc" \
            tests/cuda/header_check.cc) >"$LOGDIR/header_check.log" 2>&1; then
            note "PASS: cuda/driver.h matches $inc/cuda.h ($(grep -m1 '#define CUDA_VERSION' "$inc/cuda.h" | awk '{print $3}'))"
            PASSED=$((PASSED + 1))
        else
            note "FAIL: cuda/driver.h does not match $inc/cuda.h"; FAILED=$((FAILED + 1))
            head -20 "$LOGDIR/header_check.log" | sed 's/^/    /'
        fi
    else
        note "SKIP: header check (no cuda.h or no C++ compiler here)"; SKIPPED=$((SKIPPED + 1))
    fi
fi

# ---- the bandwidth probe ----
if [ "$SKIP_PROBE" = 0 ]; then
    probe=$BINDIR/bw_probe
    if ! "$probe" --help >/dev/null 2>&1; then
        # The prebuilt probe does not run here (another libc): rebuild it from the package.
        note "bw_probe: the prebuilt binary does not run here; rebuilding it with gcc"
        probe=$LOGDIR/bw_probe
        (cd "$SRCDIR" && gcc -O2 -std=c11 -D_GNU_SOURCE -I. -isystem . base/*.c cuda/*.c cuda/*/*.c \
            tests/cuda/bw_probe.c -ldl -lpthread -o "$probe") >"$LOGDIR/bw_probe_build.log" 2>&1 ||
            { note "FAIL: bw_probe rebuild"; sed 's/^/    /' "$LOGDIR/bw_probe_build.log" | head -20; }
    fi
    timeout -k 5 180 "$probe" --size "$PROBE_SIZE" --iters "$PROBE_ITERS" >"$LOGDIR/bw_probe.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        note "PASS: bw_probe (HtoD/DtoH/DtoD, $PROBE_SIZE x $PROBE_ITERS, round trip checked)"
        PASSED=$((PASSED + 1))
        while IFS= read -r l; do note "    $l"; done <"$LOGDIR/bw_probe.log"
    else
        note "FAIL: bw_probe exited $rc"; FAILED=$((FAILED + 1))
        sed 's/^/    /' "$LOGDIR/bw_probe.log" | head -20
    fi
fi

# ---- what the real driver answers to the fake driver's questions (scripts/cuda_facts.c):
# informational, recorded in the logs for a diff against the fake's answers ----
if [ -f "$SRCDIR/scripts/cuda_facts.c" ] && command -v gcc >/dev/null 2>&1; then
    inc=/usr/local/cuda/include
    if [ -f "$inc/cuda.h" ] && gcc -O1 -I"$inc" "$SRCDIR/scripts/cuda_facts.c" -o "$LOGDIR/cuda_facts" \
        -ldl -lpthread -L/usr/local/cuda/lib64/stubs -lcuda >"$LOGDIR/cuda_facts_build.log" 2>&1; then
        timeout -k 5 60 "$LOGDIR/cuda_facts" >"$LOGDIR/cuda_facts.txt" 2>&1
        note "INFO: scripts/cuda_facts.c answers ($(grep -c '^fact:' "$LOGDIR/cuda_facts.txt") facts) in gpu_check_logs/cuda_facts.txt"
    else
        note "INFO: scripts/cuda_facts.c not built here (no cuda.h or link stub)"
    fi
fi

[ "$FAILED" -eq 0 ] && finish 0
finish 1
