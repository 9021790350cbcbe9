#!/usr/bin/env bash
# scripts/gpu_check.sh - proves the cuda/ owners on a machine with an NVIDIA GPU: runs the
# cuda tests (tests/cuda: driver, memory, pinned, stream, ipc, fault) against the REAL
# libcuda (OTE_TEST_REAL_CUDA=1; the fake-only cases skip with their reason), checks
# cuda/driver.h against the machine's cuda.h, then a short bandwidth probe (HtoD, DtoH,
# DtoD of 256 MiB through the owners vs cuMemcpy directly; GB/s and ratios), then the
# engine phase (scripts/gpu_check_engine.sh): ote_bench over TCP staging, shm CUDA IPC,
# shm staging and RDMA over verbs/sim, READ and WRITE, every byte checked, and issue 12's
# figures (staged TCP vs host TCP, IPC vs cuMemcpyDtoD, the staging chunk/depth sweep).
#
#   scripts/gpu_check.sh                  bazel here: build, then run everything
#   scripts/gpu_check.sh --package DIR    build here with bazel and put the test binaries,
#                                         the probe, the fake libcuda, the sources the
#                                         fallbacks need and this script into DIR
#   DIR/gpu_check.sh --prebuilt DIR       run from a package on a machine without bazel
#   (also: scripts/gpu_check.sh --prebuilt DIR)
#
# With the device tool (its machine has no bazel; it runs in a copy of the repo root and
# carries ignored folders named in carry): here, in the repo root,
#   echo /gpu_pkg/ >>.git/info/exclude; scripts/gpu_check.sh --package gpu_pkg
# then run `gpu_pkg/gpu_check.sh --prebuilt gpu_pkg` there with carry ["gpu_pkg"]
# (about 25 MB; $OUT is set there, so the summary and the logs come back).
#
# Options: --fake          use the fake libcuda of the build/package instead of the real
#                          driver (to check this script on a machine without a GPU; the
#                          fake's control API is then present, so fake-only cases run too)
#          --probe-size S  bytes per probe copy (default 256M); --probe-iters N (default 5)
#          --skip-tests / --skip-probe / --skip-engine
#          --engine-secs S seconds per engine figure (default 2); --check-secs S seconds
#                          per engine correctness result (default 1); --engine-budget S
#                          whole seconds the engine phase may take (default 300): a run
#                          that would start past it is skipped (SKIP line)
# Environment: OTE_CUDA_LIBRARY (driver to load instead of libcuda.so.1), BAZEL (default
#   bazel), BAZEL_STARTUP (startup options, e.g. --output_base=...), OUT (when set, a
#   summary is written to $OUT/gpu_check_summary.txt and the logs, as one archive, to
#   $OUT/gpu_check_logs.tar.gz: the device tool returns at most 8 files).
#
# Exit status: 0 every check passed; 1 something failed; 2 no GPU here (no loadable CUDA
# driver or no device: prints "no GPU: <reason>" and runs nothing); 64 usage error.
# Each test binary runs under a 150 s timeout, the probe under 180 s, each ote_bench run
# under 45 s and the engine phase under its budget; a healthy run takes about a minute of
# tests, well under a minute of probe and about two minutes of engine phase (about 40
# ote_bench runs). With OUT set, the summary grows line by line as the run goes, so a run
# stopped by an outer timeout still leaves what it had found.
set -u
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
TESTS=(driver_test memory_test pinned_test stream_test ipc_test fault_test)
MODE=bazel PKG="" USE_FAKE=0 PROBE_SIZE=256M PROBE_ITERS=5 SKIP_TESTS=0 SKIP_PROBE=0
SKIP_ENGINE=0 ENGINE_FIG_SECS=2 ENGINE_CHECK_SECS=1 ENGINE_BUDGET=300
EXIT_NO_GPU=2

usage() { sed -n '2,/^set -u$/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 64; }
while [ $# -gt 0 ]; do
    case "$1" in
        --package) MODE=package PKG=${2:-}; shift 2 || usage ;;
        --prebuilt) MODE=prebuilt PKG=${2:-}; shift 2 || usage ;;
        --fake) USE_FAKE=1; shift ;;
        --probe-size) PROBE_SIZE=${2:-}; shift 2 || usage ;;
        --probe-iters) PROBE_ITERS=${2:-}; shift 2 || usage ;;
        --skip-tests) SKIP_TESTS=1; shift ;;
        --skip-probe) SKIP_PROBE=1; shift ;;
        --skip-engine) SKIP_ENGINE=1; shift ;;
        --engine-secs) ENGINE_FIG_SECS=${2:-}; shift 2 || usage ;;
        --check-secs) ENGINE_CHECK_SECS=${2:-}; shift 2 || usage ;;
        --engine-budget) ENGINE_BUDGET=${2:-}; shift 2 || usage ;;
        -h | --help) usage ;;
        *) echo "gpu_check: unknown argument $1" >&2; usage ;;
    esac
done
if [ "$MODE" != bazel ] && [ -z "$PKG" ]; then echo "gpu_check: $MODE needs a directory" >&2; exit 64; fi
for v in "$ENGINE_FIG_SECS" "$ENGINE_CHECK_SECS"; do
    [[ "$v" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "gpu_check: --engine-secs/--check-secs take seconds, not '$v'" >&2; exit 64; }
done
[[ "$ENGINE_BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_check: --engine-budget takes whole seconds" >&2; exit 64; }

BAZEL=${BAZEL:-bazel}
read -r -a BSTART <<<"${BAZEL_STARTUP:-}"
BUILD_TARGETS=()
for t in "${TESTS[@]}"; do BUILD_TARGETS+=("//tests/cuda:$t"); done
BUILD_TARGETS+=(//tests/cuda:bw_probe //tests/cuda:libfake_cuda.so //tools:ote_bench)

bazel_build() { # extra build flags...
    local root
    root=$(cd "$SELF_DIR/.." && pwd)
    (cd "$root" && "$BAZEL" "${BSTART[@]}" build "$@" "${BUILD_TARGETS[@]}") || return 1
    BIN_ROOT=$(cd "$root" && "$BAZEL" "${BSTART[@]}" info "$@" bazel-bin 2>/dev/null)
    BIN=$BIN_ROOT/tests/cuda
    SRC_ROOT=$root
}

# ---- --package: build here, copy what the GPU machine needs ----
if [ "$MODE" = package ]; then
    command -v "$BAZEL" >/dev/null || { echo "gpu_check: --package needs bazel"; exit 1; }
    # Our libraries linked in (not as the test-only shared objects bazel uses by
    # default), libstdc++/libgcc asked for statically. The binaries still list
    # libstdc++.so.6 as NEEDED (Bazel's toolchain adds -lstdc++; no symbol of it is
    # used) and need glibc 2.34 or later; ote_bench also needs the system libraries
    # copied to lib/bench below.
    bazel_build --dynamic_mode=off --linkopt=-static-libstdc++ --linkopt=-static-libgcc || { echo "gpu_check: build failed"; exit 1; }
    mkdir -p "$PKG/bin" "$PKG/lib" "$PKG/src" || exit 1
    for t in "${TESTS[@]}" bw_probe; do install -m 755 "$BIN/$t" "$PKG/bin/$t" || exit 1; done
    install -m 755 "$BIN/libfake_cuda.so" "$PKG/lib/libfake_cuda.so" || exit 1
    # ote_bench: the engine, base, cuda and verbs linked in statically; libcuda is opened
    # with dlopen (never NEEDED); the system libraries it links (libibverbs, libhwloc,
    # libsodium and theirs) go to lib/bench, used on the GPU machine only if it lacks them.
    install -m 755 "$BIN_ROOT/tools/ote_bench" "$PKG/bin/ote_bench" || exit 1
    needed=$(readelf -d "$PKG/bin/ote_bench" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "gpu_check: ote_bench NEEDs: $needed"
    case " $needed" in
        *libcuda* | *_S*) echo "gpu_check: ote_bench links libcuda or a library of ours dynamically"; exit 1 ;;
    esac
    mkdir -p "$PKG/lib/bench" || exit 1
    ldd "$PKG/bin/ote_bench" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
        case "$name" in libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) continue ;; esac
        cp -L "$path" "$PKG/lib/bench/$name" || exit 1
    done || exit 1
    echo "gpu_check: ote_bench's system libraries in lib/bench: $(cd "$PKG/lib/bench" && echo *)"
    install -m 644 "$SELF_DIR/gpu_check_engine.sh" "$PKG/gpu_check_engine.sh" || exit 1
    # Sources for the fallbacks: the header check, and rebuilding the probe with gcc when
    # the prebuilt binaries do not run on the GPU machine's libc.
    # (base's headers include the public status header, base/include/ote/status.h.)
    (cd "$SRC_ROOT" && tar -cf - base/*.c base/*.h base/include/ote/*.h cuda/*.c cuda/*.h \
        cuda/*/*.c cuda/*/*.h $(ls engine/include/ote/*.h 2>/dev/null) tests/cuda/header_check.cc tests/cuda/bw_probe.c scripts/cuda_facts.c) |
        tar -xf - -C "$PKG/src" || exit 1
    for h in uthash.h utlist.h; do [ -f "/usr/include/$h" ] && cp "/usr/include/$h" "$PKG/src/"; done
    install -m 755 "$SELF_DIR/gpu_check.sh" "$PKG/gpu_check.sh" || exit 1
    (cd "$SRC_ROOT" && { git rev-parse HEAD 2>/dev/null || echo unknown; } | tr -d '\n' &&
        { git diff --quiet HEAD 2>/dev/null || echo -n " with uncommitted changes"; } && echo) >"$PKG/REVISION"
    echo "gpu_check: package ready in $PKG ($(du -sh "$PKG" | cut -f1)); on the GPU machine run:"
    echo "    $PKG/gpu_check.sh --prebuilt $PKG"
    exit 0
fi

# ---- run (bazel or prebuilt) ----
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT
SUMMARY=()
BENCH_ENV=() # variables of every ote_bench run (LD_LIBRARY_PATH, see --prebuilt)
PASSED=0 FAILED=0 SKIPPED=0
note() {
    echo "$*"
    SUMMARY+=("$*")
    if [ -n "${OUT:-}" ]; then printf '%s\n' "$*" >>"$OUT/gpu_check_summary.txt"; fi
}
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && : >"$OUT/gpu_check_summary.txt"; fi
finish() { # exit code
    note "gpu_check: $PASSED passed, $FAILED failed, $SKIPPED skipped"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT" && (cd "$LOGDIR" && find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.txt' \
            -o -name '*.out' -o -name '*.err' -o -name '*.json' \) -print0 | sort -z |
            tar -czf "$OUT/gpu_check_logs.tar.gz" --null -T - --transform 's|^\./|gpu_check_logs/|')
        printf '%s\n' "${SUMMARY[@]}" >"$OUT/gpu_check_summary.txt"
    fi
    exit "$1"
}

# Is there a driver with a device? python3 (ctypes) asks it directly; without python3,
# libcuda.so.1 must be installed and the probe's own check (exit 2) decides once built.
gpu_reason() { # driver library: prints the reason there is no GPU, or nothing
    if command -v python3 >/dev/null; then
        python3 - "$1" <<'PY'
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
    elif [ "$1" = libcuda.so.1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
        echo "libcuda.so.1 is not installed"
    fi
}
no_gpu() { # reason: exit 2, having run nothing
    note "no GPU: $1"
    [ -n "${OUT:-}" ] && mkdir -p "$OUT" && printf '%s\n' "${SUMMARY[@]}" >"$OUT/gpu_check_summary.txt"
    exit $EXIT_NO_GPU
}
# Without --fake the driver is known before anything is built or run.
if [ "$USE_FAKE" = 0 ]; then
    why=$(gpu_reason "${OTE_CUDA_LIBRARY:-libcuda.so.1}")
    [ -n "$why" ] && no_gpu "$why"
fi

if [ "$MODE" = bazel ]; then
    command -v "$BAZEL" >/dev/null || {
        echo "gpu_check: no bazel here; build a package elsewhere (--package DIR) and run --prebuilt DIR"
        exit 64
    }
    bazel_build || { note "FAIL: bazel build of the cuda tests and ote_bench"; FAILED=1; finish 1; }
    BINDIR=$BIN FAKELIB=$BIN/libfake_cuda.so SRCDIR=$SRC_ROOT BENCH=$BIN_ROOT/tools/ote_bench
else
    PKG=$(cd "$PKG" && pwd) || exit 64
    BINDIR=$PKG/bin FAKELIB=$PKG/lib/libfake_cuda.so SRCDIR=$PKG/src BENCH=$PKG/bin/ote_bench
    [ -f "$PKG/REVISION" ] && note "package built from revision $(cat "$PKG/REVISION")"
    # ote_bench's system libraries: this machine's, and the package's copy of each one it
    # lacks (linked into a folder of their own, given to ote_bench alone).
    if [ -x "$BENCH" ] && ldd "$BENCH" 2>/dev/null | grep -q 'not found'; then
        mkdir -p "$LOGDIR/benchlib"
        for _ in 1 2 3 4 5; do
            missing=$(LD_LIBRARY_PATH="$LOGDIR/benchlib" ldd "$BENCH" 2>/dev/null | awk '/not found/ { print $1 }')
            [ -z "$missing" ] && break
            for l in $missing; do
                [ -f "$PKG/lib/bench/$l" ] && ln -sf "$PKG/lib/bench/$l" "$LOGDIR/benchlib/$l"
            done
        done
        BENCH_ENV=("LD_LIBRARY_PATH=$LOGDIR/benchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
        note "ote_bench: this machine lacks $(cd "$LOGDIR/benchlib" && echo *): the package's copies used"
    fi
fi
PROBE=$BINDIR/bw_probe

if [ "$USE_FAKE" = 1 ]; then
    export OTE_CUDA_LIBRARY=$FAKELIB
    note "driver: the FAKE libcuda ($FAKELIB) -- this checks the script, not a GPU"
    why=$(gpu_reason "$FAKELIB")
    [ -n "$why" ] && no_gpu "$why"
fi
DRIVER=${OTE_CUDA_LIBRARY:-libcuda.so.1}
if ! command -v python3 >/dev/null && "$PROBE" --help >/dev/null 2>&1; then
    why=$("$PROBE" --size 4K --iters 1 2>/dev/null)
    [ $? -eq 2 ] && no_gpu "${why#no GPU: }"
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

# ---- the bandwidth probe (the engine phase takes its cuMemcpyDtoD figure too) ----
if { [ "$SKIP_PROBE" = 0 ] || [ "$SKIP_ENGINE" = 0 ]; } && ! "$PROBE" --help >/dev/null 2>&1; then
    # The prebuilt probe does not run here (another libc): rebuild it from the package.
    note "bw_probe: the prebuilt binary does not run here; rebuilding it with gcc"
    PROBE=$LOGDIR/bw_probe
    (cd "$SRCDIR" && gcc -O2 -std=c11 -D_GNU_SOURCE -I. -isystem . base/*.c cuda/*.c cuda/*/*.c \
        tests/cuda/bw_probe.c -ldl -lpthread -o "$PROBE") >"$LOGDIR/bw_probe_build.log" 2>&1 ||
        { note "FAIL: bw_probe rebuild"; sed 's/^/    /' "$LOGDIR/bw_probe_build.log" | head -20; }
fi
if [ "$SKIP_PROBE" = 0 ]; then
    timeout -k 5 180 "$PROBE" --size "$PROBE_SIZE" --iters "$PROBE_ITERS" >"$LOGDIR/bw_probe.log" 2>&1
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

# ---- the engine phase: ote_bench over the driver (scripts/gpu_check_engine.sh) ----
if [ "$SKIP_ENGINE" = 0 ]; then
    # shellcheck source=scripts/gpu_check_engine.sh
    . "$SELF_DIR/gpu_check_engine.sh"
    engine_phase
fi

# ---- what the real driver answers to the fake driver's questions (scripts/cuda_facts.c):
# informational, recorded in the logs for a diff against the fake's answers ----
if [ -f "$SRCDIR/scripts/cuda_facts.c" ] && command -v gcc >/dev/null 2>&1; then
    inc=/usr/local/cuda/include
    if [ -f "$inc/cuda.h" ] && gcc -O1 -I"$inc" "$SRCDIR/scripts/cuda_facts.c" -o "$LOGDIR/cuda_facts" \
        -ldl -lpthread -L/usr/local/cuda/lib64/stubs -lcuda >"$LOGDIR/cuda_facts_build.log" 2>&1; then
        timeout -k 5 60 "$LOGDIR/cuda_facts" >"$LOGDIR/cuda_facts.txt" 2>&1
        note "INFO: scripts/cuda_facts.c answers ($(grep -c '^fact:' "$LOGDIR/cuda_facts.txt") facts) in gpu_check_logs/cuda_facts.txt (of $OUT/gpu_check_logs.tar.gz)"
    else
        note "INFO: scripts/cuda_facts.c not built here (no cuda.h or link stub)"
    fi
fi

[ "$FAILED" -eq 0 ] && finish 0
finish 1
