#!/usr/bin/env bash
# Runs every OrbitTE test on a fresh Debian 12 machine: installs what it needs, checks
# the include layering, runs the Bazel suites in the default and the AddressSanitizer
# (+LeakSanitizer) configurations (they include //tests/fuzz:control_fuzz_test, the
# control-plane fuzzer run for a bounded time), checks that planted upward dependencies
# are visibility errors, and builds the outside consumer workspace against //verbs
# alone. Ends with a line "N passed, N failed, N skipped" counted per test case; exits
# non-zero on any failure.
#
#   scripts/test.sh                 everything
#   OTE_TEST_CONFIGS=default scripts/test.sh   only the default configuration
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
scripts/deps.sh || { echo "dependency installation failed"; echo "0 passed, 1 failed"; exit 1; }

PASSED=0 FAILED=0 SKIPPED=0
LOGDIR=$(mktemp -d)
trap 'rm -rf "$LOGDIR"' EXIT
record() { # name, exit code
    if [ "$2" -eq 0 ]; then PASSED=$((PASSED + 1)); echo "PASS: $1"
    else FAILED=$((FAILED + 1)); echo "FAIL: $1"; fi
}

echo "== include layering"
scripts/check_layering.sh; record "include layering" $?
scripts/check_layering.sh --self-test; record "include layering catches planted includes" $?

BAZEL_FLAGS=(--keep_going --test_output=errors --local_test_jobs=2)
for cfg in ${OTE_TEST_CONFIGS:-default asan}; do
    echo "== bazel test //... ($cfg)"
    extra=()
    [ "$cfg" = default ] || extra=(--config="$cfg")
    bazel test "${BAZEL_FLAGS[@]}" "${extra[@]}" //... 2>&1 | tee "$LOGDIR/$cfg.log"
    rc=${PIPESTATUS[0]}
    testlogs=$(bazel info "${extra[@]}" bazel-testlogs 2>/dev/null)
    read -r p f s < <(python3 scripts/count_results.py "$LOGDIR/$cfg.log" "$testlogs")
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
        echo "bazel exited with $rc ($cfg): build or infrastructure failure"
        f=$((f + 1))
    fi
    echo "$cfg: $p passed, $f failed, $s skipped"
    PASSED=$((PASSED + p)) FAILED=$((FAILED + f)) SKIPPED=$((SKIPPED + s))
done

echo "== planted upward dependencies fail with a visibility error"
(
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    git ls-files -z | xargs -0 -I{} cp --parents {} "$scratch/" 2>/dev/null ||
        tar --exclude='./bazel-*' -cf - . | tar -xf - -C "$scratch"
    printf '\ncc_library(name = "planted", deps = ["//qp"])\n' >>"$scratch/context/BUILD.bazel"
    printf '\ncc_library(name = "planted", deps = ["//verbs"])\n' >>"$scratch/cuda/BUILD.bazel"
    cd "$scratch" &&
    out=$(bazel --output_user_root="$HOME/.cache/bazel_consumer" build --keep_going \
        //context:planted //cuda:planted 2>&1)
    rc=$?
    bazel --output_user_root="$HOME/.cache/bazel_consumer" shutdown >/dev/null 2>&1
    [ $rc -ne 0 ] &&
    printf '%s' "$out" | grep -q "target '//qp:qp' is not visible from target '//context:planted'" &&
    printf '%s' "$out" | grep -q "target '//verbs:verbs' is not visible from target '//cuda:planted'"
)
record "planted //context -> //qp and //cuda -> //verbs deps are visibility errors" $?

echo "== outside consumer workspace (//verbs alone)"
(
    cd tests/consumer &&
    bazel --output_user_root="$HOME/.cache/bazel_consumer" build //app:verbs_user &&
    ./bazel-bin/app/verbs_user
)
record "consumer workspace builds and runs against //verbs alone" $?
(
    cd tests/consumer &&
    out=$(bazel --output_user_root="$HOME/.cache/bazel_consumer" build //layered:context_user 2>&1)
    rc=$?
    [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "is not visible"
)
record "consumer workspace cannot use //context (not visible)" $?
( cd tests/consumer && bazel --output_user_root="$HOME/.cache/bazel_consumer" shutdown )

echo
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" -eq 0 ]
