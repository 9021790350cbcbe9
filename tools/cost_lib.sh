# tools/cost_lib.sh - sourced by tools/rdma_slice_cost.sh and tools/shm_req_cost.sh: build
# a cost driver (a //tests/engine binary that takes a count) and measure runs of it in
# instructions with valgrind --tool=callgrind, summed by source file.
#
# cost_setup TARGET       installs valgrind from Debian when missing, builds //tests/engine:
#                         TARGET (-c opt; BAZEL_OUTPUT_BASE selects an output base), sets BIN
#                         and TMP (a directory removed at exit)
# cost_setup_base REV TARGET  builds //tests/engine:TARGET of the git revision REV too (its
#                         tree exported with git archive under $TMP, built in a Bazel
#                         output base of its own, which is shut down and removed at exit)
#                         and sets BASE_BIN: the same measurement of the code before a change
# cost_measure N ENG COPY [BINARY]  runs BINARY (default "$BIN") N under callgrind and prints
#                         "engine verbs copy libc total": self instructions of files whose
#                         path matches the regex ENG (outside tests/), of verbs/, of libc
#                         functions matching COPY, of every other library function, and of
#                         the whole process (the test driver's own code is in the total only)

cost_setup() {
    if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
        echo "valgrind not found: installing it from Debian" >&2
        local sudo=""
        if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
        $sudo apt-get update -q
        $sudo apt-get install -y -q valgrind
    fi
    local bazel=(bazel)
    if [ -n "${BAZEL_OUTPUT_BASE:-}" ]; then bazel+=(--output_base="$BAZEL_OUTPUT_BASE"); fi
    "${bazel[@]}" build -c opt "//tests/engine:$1" >&2
    BIN="$("${bazel[@]}" info -c opt bazel-bin 2>/dev/null)/tests/engine/$1"
    TMP=$(mktemp -d)
    trap cost_cleanup EXIT
}

cost_cleanup() {
    if [ -n "${BASE_DIR:-}" ] && [ -d "$BASE_DIR" ]; then
        (cd "$BASE_DIR" && bazel clean --expunge >/dev/null 2>&1 && bazel shutdown >/dev/null 2>&1) || true
    fi
    rm -rf "$TMP"
}

cost_setup_base() {
    local rev=$1 target=$2
    BASE_DIR="$TMP/base"
    mkdir -p "$BASE_DIR"
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || {
        echo "no such revision: $rev" >&2
        exit 2
    }
    git archive "$rev" | tar -x -C "$BASE_DIR"
    (cd "$BASE_DIR" && bazel build -c opt "//tests/engine:$target" >&2)
    BASE_BIN="$(cd "$BASE_DIR" && bazel info -c opt bazel-bin 2>/dev/null)/tests/engine/$target"
}

cost_measure() {
    local n=$1 eng=$2 copy=$3 bin=${4:-$BIN}
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$n" "$bin" "$n" >"$TMP/run.$n" 2>"$TMP/vg.$n" || {
        echo "run of $bin $n failed:" >&2
        cat "$TMP/run.$n" "$TMP/vg.$n" >&2
        exit 1
    }
    callgrind_annotate --auto=no --threshold=100 --inclusive=no "$TMP/cg.$n" | awk -v eng="$eng" -v copy="$copy" '
        /file:function/ { go = 1; next }
        go && /^ *[0-9,]+ / && !/PROGRAM TOTALS/ {
            v = $1; gsub(",", "", v); line = $0; sub(/ \[.*$/, "", line)
            if (line ~ /\/tests\//) drv += v
            else if (line ~ eng) en += v
            else if (line ~ /\/verbs\//) vb += v
            else if (line ~ copy) cp += v
            else lib += v
            tot += v
        }
        END { printf "%d %d %d %d %d\n", en, vb, cp, lib, tot }'
}
