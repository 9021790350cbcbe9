#!/bin/bash
# Test of scripts/gpu_check.sh's engine phase judging (scripts/gpu_check_engine.sh) and of
# gpu_check.sh's no-GPU exit, with no GPU, no engine and no build: a stub ote_bench prints
# the JSON lines ote_bench would (the stub's path, check and exit status set per case), so
# each verdict is checked: the asserted path passes; another path, a failed check, a
# missing line or a non-zero exit fails; GPUDirect that comes out staged over a real
# driver is a SKIP but a FAIL over the fake; a figure of another path is no figure. The
# real runs of the phase are `scripts/gpu_check.sh --fake` (docs/testing.md, "Testing without
# hardware"); this test keeps its verdicts from drifting. About a second.
#
# Usage (from Bazel): gpu_check_engine_test.sh <gpu_check_engine.sh> <gpu_check.sh>
set -u
ENGINE_SH="${1:?usage: $0 <gpu_check_engine.sh> <gpu_check.sh>}"
GPU_CHECK="${2:?usage: $0 <gpu_check_engine.sh> <gpu_check.sh>}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
T_PASSED=0 T_FAILED=0
t_pass() { T_PASSED=$((T_PASSED + 1)); echo "PASS: $1"; }
t_fail() { T_FAILED=$((T_FAILED + 1)); echo "FAIL: $1"; }

# The stub ote_bench: STUB_PATH, STUB_CHECK (ok|failed), STUB_LINES, STUB_RC; it records
# its environment's GPU keys and its arguments in $TMP/stub.args.
STUB=$TMP/stub_bench
cat >"$STUB" <<'EOF'
#!/bin/bash
echo "OTE_GPU_PATHS=${OTE_GPU_PATHS:-} OTE_VERBS_PROVIDER=${OTE_VERBS_PROVIDER:-} OTE_GPU_STAGING_CHUNK=${OTE_GPU_STAGING_CHUNK:-} $*" >"$STUB_LOG"
for ((i = 0; i < ${STUB_LINES:-2}; i++)); do
    echo "{\"transport\":\"tcp\",\"gbps\":${STUB_GBPS:-1.5},\"check\":\"${STUB_CHECK:-ok}\",\"path\":\"${STUB_PATH:-staging}\",\"per_nic\":{},\"grants\":0}"
done
exit "${STUB_RC:-0}"
EOF
chmod +x "$STUB"
export STUB_LOG=$TMP/stub.args

# What gpu_check.sh gives the phase.
SUMMARY=() PASSED=0 FAILED=0 SKIPPED=0 LOGDIR=$TMP BENCH=$STUB BENCH_ENV=() USE_FAKE=0
ENGINE_CHECK_SECS=1 ENGINE_FIG_SECS=2 ENGINE_BUDGET=300
note() { echo "    | $*"; SUMMARY+=("$*"); }
# shellcheck source=scripts/gpu_check_engine.sh
. "$ENGINE_SH"

# expect NAME WANT_P WANT_F WANT_S WANT_LINE_PREFIX: the counters moved by exactly these
# and the last note starts with WANT_LINE_PREFIX.
expect() {
    local name=$1 p=$2 f=$3 s=$4 prefix=$5 last=${SUMMARY[${#SUMMARY[@]}-1]}
    case "$last" in "$prefix"*) ;; *) last="" ;; esac
    if [ "$PASSED" -eq "$p" ] && [ "$FAILED" -eq "$f" ] && [ "$SKIPPED" -eq "$s" ] && [ -n "$last" ]; then
        t_pass "$name"
    else
        t_fail "$name: passed/failed/skipped $PASSED/$FAILED/$SKIPPED, want $p/$f/$s; last note: ${SUMMARY[${#SUMMARY[@]}-1]}"
    fi
    PASSED=0 FAILED=0 SKIPPED=0
}
SUMMARY=("")
has_args() { grep -q -- "$1" "$STUB_LOG" || { t_fail "stub args lack '$1': $(cat "$STUB_LOG")"; return 1; }; }

STUB_PATH=staging eng_check tcp_ok tcp write cuda:0 cuda:0 staging staging
expect "the asserted path passes" 1 0 0 "PASS: engine tcp_ok"
has_args "OTE_GPU_PATHS=staging OTE_VERBS_PROVIDER= " && has_args "--check" &&
    has_args "--local-mem cuda:0 --remote-mem cuda:0" && t_pass "check runs name the memories, --check, gpu_paths"

STUB_PATH=staging eng_check ipc_staged shm read cuda:0 cuda:0 ipc ipc,staging --remote-ipc
expect "another path than the asserted one fails" 0 1 0 "FAIL: engine ipc_staged"
has_args "OTE_GPU_PATHS=ipc,staging" && has_args "--remote-ipc" && t_pass "extra arguments and gpu_paths reach ote_bench"

STUB_CHECK=failed eng_check bad_bytes tcp read cuda:0 host staging staging
expect "a failed byte check fails" 0 1 0 "    (tcp read cuda:0->host: 0 of 2"

STUB_LINES=1 eng_check one_line tcp read host cuda:0 staging staging
expect "a missing result fails" 0 1 0 "    (tcp read host->cuda:0: 1 of 2"

STUB_RC=1 eng_check exit1 tcp write cuda:0 cuda:0 staging staging
expect "a non-zero exit fails" 0 1 0 "    (tcp write cuda:0->cuda:0: 2 of 2"

STUB_PATH=staging eng_check direct_real rdma write cuda:0 host direct direct,staging
expect "GPUDirect staged over a real driver is a SKIP" 0 0 1 "SKIP: engine direct_real"
has_args "OTE_VERBS_PROVIDER=sim" && t_pass "rdma checks run over verbs/sim"

USE_FAKE=1 STUB_PATH=staging eng_check direct_fake rdma write cuda:0 host direct direct,staging
expect "GPUDirect staged over the fake driver fails" 0 1 0 "FAIL: engine direct_fake"
USE_FAKE=0

STUB_PATH=direct eng_check direct_ok rdma read cuda:0 host direct direct,staging
expect "GPUDirect as asserted passes" 1 0 0 "PASS: engine direct_ok"

# the phase's budget: a run past it is not started, a SKIP and no FAIL
rm -f "$STUB_LOG"
ENGINE_BUDGET=0 eng_check late tcp read cuda:0 cuda:0 staging staging
expect "a check past the budget is skipped" 0 0 1 "SKIP: engine late not run"
ENGINE_BUDGET=0 eng_fig late_fig host -- --op read
expect "a figure past the budget is skipped" 0 0 1 "SKIP: engine late_fig not run"
[ ! -e "$STUB_LOG" ] && [ -z "$FIG" ] && t_pass "... and ote_bench was not started" ||
    t_fail "a run past the budget started ote_bench"

# figures
STUB_GBPS=3.25 STUB_PATH=ipc eng_fig fig_ok ipc OTE_GPU_STAGING_CHUNK=64M -- --op read
if [ "$FIG" = 3.25 ] && [ "$FAILED" -eq 0 ] && has_args "OTE_GPU_STAGING_CHUNK=64M" && has_args "--json"; then
    t_pass "a figure of the asserted path is its GB/s"
else t_fail "figure: FIG='$FIG' FAILED=$FAILED"; fi
STUB_PATH=staging eng_fig fig_wrong ipc -- --op read
expect "a figure of another path is a FAIL" 0 1 0 "FAIL: engine figure fig_wrong"
[ -z "$FIG" ] && t_pass "... and no figure" || t_fail "a wrong-path figure gave '$FIG'"
STUB_RC=3 eng_fig fig_rc host -- --op read
expect "a figure whose run failed is a FAIL" 0 1 0 "FAIL: engine fig_rc (exit 3)"
[ "$(ratio 0.9 1)" = 0.90 ] && [ "$(ratio "" 1)" = - ] && [ "$(ratio 1 0)" = - ] &&
    [ "$(verdict 0.90 0.9)" = met ] && [ "$(verdict 0.89 0.9)" = MISSED ] && [ "$(verdict - 0.8)" = "no figure" ] &&
    [ "$(USE_FAKE=1 verdict 0.5 0.9)" = "(fake: not judged)" ] && t_pass "ratio and verdict" ||
    t_fail "ratio/verdict: $(ratio 0.9 1) $(verdict 0.90 0.9) $(verdict 0.89 0.9)"

# gpu_check.sh without a driver: exit 2, "no GPU: ...", the summary in $OUT, nothing
# built (BAZEL=false would fail the build with exit 1).
if command -v python3 >/dev/null; then
    out=$(OTE_CUDA_LIBRARY=/nonexistent/libcuda.so.1 BAZEL=false OUT=$TMP/out bash "$GPU_CHECK" 2>&1)
    rc=$?
    if [ $rc -eq 2 ] && [[ "$out" == "no GPU: cannot load the CUDA driver /nonexistent/libcuda.so.1"* ]] &&
        grep -q '^no GPU: ' "$TMP/out/gpu_check_summary.txt"; then
        t_pass "no driver: exit 2, no GPU, nothing built"
    else t_fail "no driver: exit $rc, output: $out"; fi
else
    echo "SKIPPED: no python3 here for gpu_check.sh's driver question"
fi
out=$(bash "$GPU_CHECK" --engine-secs 2x 2>&1)
[ $? -eq 64 ] && t_pass "a bad --engine-secs is a usage error" || t_fail "--engine-secs 2x: $out"

echo "$T_PASSED passed, $T_FAILED failed"
[ "$T_FAILED" -eq 0 ]
