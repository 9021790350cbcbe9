#!/usr/bin/env bash
# Proves that engine/'s owner libraries keep their boundaries, on a scratch copy of the
# tree (the real tree is never edited):
#
#   1. a planted //engine/tcp -> //engine/rdma dependency (and the reverse) fails the
#      build with Bazel's "is not visible" error: a transport never sees another one;
#   2. the outside consumer workspace (tests/consumer) builds and runs
#      //engine_app:engine_user against @orbitte//engine through <ote/ote.h> alone;
#   3. the same program with a planted #include of an engine *_internal.h header
#      (engine/engine_internal.h, engine/core_internal.h, engine/router_internal.h,
#      engine/registry_internal.h, engine/tcp/tcp_internal.h)
#      fails to build with the header's "is internal to OrbitTE's engine" error;
#      and a planted #include of a layer's *_internal.h (grant, qp, cq, context, verbs)
#      fails with its "is internal to OrbitTE's ... layer" error;
#   4. the consumer cannot depend on @orbitte//engine/tcp (not visible from outside).
#
# Usage: scripts/check_visibility.sh
#   Environment: OTE_VIS_SCRATCH   scratch directory, reused between runs so that Bazel's
#                                  cache stays warm (default ~/.cache/ote_check_visibility;
#                                  one run at a time per directory)
#                OTE_VIS_BAZEL_ROOT  --output_user_root of both Bazel servers
#                                  (default ~/.cache/bazel_consumer, as scripts/test.sh)
# Exits 0 when every check passed; ends with a line "N passed, N failed".
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
SCRATCH=${OTE_VIS_SCRATCH:-$HOME/.cache/ote_check_visibility}
BROOT=${OTE_VIS_BAZEL_ROOT:-$HOME/.cache/bazel_consumer}
TREE=$SCRATCH/tree
PASSED=0 FAILED=0

record() { # name, exit code
    if [ "$2" -eq 0 ]; then PASSED=$((PASSED + 1)); echo "PASS: $1"
    else FAILED=$((FAILED + 1)); echo "FAIL: $1"; fi
}

bz() { bazel --output_user_root="$BROOT" "$@"; }

# The tree as git sees it (tracked and untracked-but-not-ignored files, working-tree
# contents), so a change under test is checked before it is committed.
copy_tree() {
    rm -rf "$TREE" && mkdir -p "$TREE" || return 1
    if git -C "$HERE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$HERE" && git ls-files -z --cached --others --exclude-standard |
            tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$TREE"
    else # not a git checkout: everything but Bazel's convenience links
        (cd "$HERE" && tar --exclude='./bazel-*' --exclude='./tests/consumer/bazel-*' -cf - .) |
            tar -xf - -C "$TREE"
    fi
    [ -f "$TREE/WORKSPACE" ] && [ -f "$TREE/tests/consumer/WORKSPACE" ]
}

# expect_fail NAME PATTERN -- bazel args...: the command must fail and print PATTERN.
expect_fail() {
    local name=$1 pattern=$2 out rc
    shift 3
    out=$(bz "$@" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && printf '%s' "$out" | grep -qF -- "$pattern"; then
        record "$name" 0
    else
        printf '%s\n' "$out" | tail -n 20
        echo "(expected a failure naming: $pattern; bazel exited with $rc)"
        record "$name" 1
    fi
}

if ! copy_tree; then
    echo "cannot copy the tree to $TREE"
    echo "0 passed, 1 failed"
    exit 1
fi

echo "== planted dependencies between transports are visibility errors"
cd "$TREE" || exit 1
printf '\ncc_library(name = "planted", deps = ["//engine/rdma"])\n' >>engine/tcp/BUILD.bazel
printf '\ncc_library(name = "planted", deps = ["//engine/tcp"])\n' >>engine/rdma/BUILD.bazel
expect_fail "planted //engine/tcp -> //engine/rdma is a visibility error" \
    "target '//engine/rdma:rdma' is not visible from target '//engine/tcp:planted'" \
    -- build --nobuild //engine/tcp:planted
expect_fail "planted //engine/rdma -> //engine/tcp is a visibility error" \
    "target '//engine/tcp:tcp' is not visible from target '//engine/rdma:planted'" \
    -- build --nobuild //engine/rdma:planted
printf '\ncc_library(name = "planted", deps = ["//engine/tcp"])\n' >>engine/shm/BUILD.bazel
printf '\ncc_library(name = "planted_shm", deps = ["//engine/shm"])\n' >>engine/tcp/BUILD.bazel
expect_fail "planted //engine/shm -> //engine/tcp is a visibility error" \
    "target '//engine/tcp:tcp' is not visible from target '//engine/shm:planted'" \
    -- build --nobuild //engine/shm:planted
expect_fail "planted //engine/tcp -> //engine/shm is a visibility error" \
    "target '//engine/shm:shm' is not visible from target '//engine/tcp:planted_shm'" \
    -- build --nobuild //engine/tcp:planted_shm
bz shutdown >/dev/null 2>&1

echo "== outside consumer workspace against //engine through <ote/ote.h>"
cd "$TREE/tests/consumer" || exit 1
bz build //engine_app:engine_user && ./bazel-bin/engine_app/engine_user
record "consumer builds and runs engine_user against //engine" $?

cp engine_app/engine_user.c "$SCRATCH/engine_user.c.orig"
for h in engine/engine_internal.h engine/core_internal.h engine/router_internal.h \
    engine/registry_internal.h engine/tcp/tcp_internal.h engine/shm/shm_internal.h; do
    { printf '#include "%s"\n' "$h"; cat "$SCRATCH/engine_user.c.orig"; } >engine_app/engine_user.c
    expect_fail "consumer cannot include $h" \
        "$h is internal to OrbitTE's engine" -- build //engine_app:engine_user
done
# The layers' own *_internal.h headers are private sources of their cc_library (never in
# hdrs) and refuse to compile outside it (an #error unless the library's local_defines
# name it): gcc has no layering check, so a private header would still be found.
for h in grant/grant_internal.h qp/qp_internal.h cq/cq_internal.h \
    context/context_internal.h verbs/sim/sim_internal.h verbs/fault_internal.h; do
    { printf '#include "%s"\n' "$h"; cat "$SCRATCH/engine_user.c.orig"; } >engine_app/engine_user.c
    expect_fail "consumer cannot include $h" \
        "$h is internal to OrbitTE's" -- build //engine_app:engine_user
done
cp "$SCRATCH/engine_user.c.orig" engine_app/engine_user.c

mkdir -p planted
printf 'cc_binary(name = "tcp_user", srcs = ["tcp_user.c"], deps = ["@orbitte//engine/tcp"])\n' \
    >planted/BUILD.bazel
printf 'int main(void) { return 0; }\n' >planted/tcp_user.c
expect_fail "consumer cannot depend on @orbitte//engine/tcp" \
    "target '@orbitte//engine/tcp:tcp' is not visible from target '//planted:tcp_user'" \
    -- build --nobuild //planted:tcp_user
bz shutdown >/dev/null 2>&1

echo
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
