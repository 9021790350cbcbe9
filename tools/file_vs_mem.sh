#!/bin/bash
# tools/file_vs_mem.sh - a peer's READ of a file registration against its READ of host
# memory, in one invocation (issue 31's second target: file READ >= 0.8x memory READ
# over the same transport).
#
# Per round and transport, three runs of RUNTIME seconds each, one after the other:
#   ote_bench --transport T --op read -b 1M -B 16 --sweep --buffer-size SIZE
#     --remote-mem host                          (the spawned target's host memory)
#     --remote-mem file:FILE   file_zero_copy=auto (cached ranges sent from the page cache)
#     --remote-mem file:FILE   file_zero_copy=off  (every range through a bounce buffer)
# and one line with the three rates and the two ratios to memory:
#   file_vs_mem: round 1 tcp  memory 3.75  file 4.04 (1.08x)  file, bounced 2.88 (0.77x) GB/s
# The file is read once through the page cache first (cat), so its pages are cached: the
# zero-copy path is what a cached file takes; a file out of the page cache is bounced
# either way (docs/files.md). GB/s is 10^9 bytes per second. Nothing is asserted; measure
# on an idle machine, and compare file systems: FILE on tmpfs (/dev/shm) keeps its
# pages, FILE on a disk shows the page cache of that file system.
#
# --reread drops the file's cached pages first (POSIX_FADV_DONTNEED, after a sync), so
# that the runs read pages that came in from the disk (large folios of readahead) rather
# than those the file's own writes left (single 4 KiB pages); docs/files.md, "Measuring",
# has both, and how pages that leave the cache between runs were handled.
#
# Usage: tools/file_vs_mem.sh [--ote-bench PATH] [--file PATH] [--size SIZE] [--reread]
#                             [--runtime SEC] [--transports "tcp shm"] [--rounds N]
#   --file        the file (default: a new one in $TMPDIR, removed at the end; a given
#                 file is grown to SIZE with data when shorter, and kept)
#   --size        bytes of the file and of the target's memory, K/M/G suffix (default 1G)
#   --runtime     seconds per run (default 4)
#   --transports  which transports (default "tcp shm")
#   --rounds      how many times to run the whole set (default 3)
set -euo pipefail

BENCH=bazel-bin/tools/ote_bench
FILE=""
SIZE=1G
RUNTIME=4
TRANSPORTS="tcp shm"
ROUNDS=3
REREAD=0
while [ $# -gt 0 ]; do
    case "$1" in
        --ote-bench) BENCH=$2; shift 2 ;;
        --file) FILE=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --transports) TRANSPORTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --reread) REREAD=1; shift ;;
        *) echo "file_vs_mem: unknown argument $1" >&2; exit 2 ;;
    esac
done
for t in $TRANSPORTS; do
    case "$t" in tcp | shm) ;; *) echo "file_vs_mem: --transports takes tcp and shm, not $t" >&2; exit 2 ;; esac
done
[ -x "$BENCH" ] || { echo "file_vs_mem: no ote_bench at $BENCH (bazel build //tools:ote_bench)" >&2; exit 2; }
bytes=$(numfmt --from=iec "$SIZE")
own=0
if [ -z "$FILE" ]; then
    FILE=$(mktemp "${TMPDIR:-/tmp}/file_vs_mem.XXXXXX")
    own=1
fi
trap '[ $own = 1 ] && rm -f "$FILE"' EXIT
have=$(stat -c %s "$FILE")
if [ "$have" -lt "$bytes" ]; then # grown with data, what it holds kept
    head -c "$((bytes - have))" /dev/urandom >>"$FILE"
fi
if [ "$REREAD" = 1 ]; then # the cached pages dropped: what the cat below reads comes from the disk
    sync "$FILE"
    python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$FILE"
fi
cat "$FILE" >/dev/null # cached

# GB/s of one ote_bench READ run; extra arguments go to ote_bench.
rate() { # transport remote-mem zero_copy
    OTE_FILE_ZERO_COPY=$3 "$BENCH" --transport "$1" --op read -b 1M -B 16 --sweep \
        --buffer-size "$SIZE" -d "${RUNTIME}s" --remote-mem "$2" --no-progress -j 2>/dev/null |
        python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print("%.2f" % rows[0]["gbps"])'
}
for r in $(seq 1 "$ROUNDS"); do
    for t in $TRANSPORTS; do
        m=$(rate "$t" host auto)
        z=$(rate "$t" "file:$FILE" auto)
        o=$(rate "$t" "file:$FILE" off)
        python3 - "$r" "$t" "$m" "$z" "$o" <<'EOF'
import sys
r, t, m, z, o = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
print("file_vs_mem: round %s %-4s memory %.2f  file %.2f (%.2fx)  file, bounced %.2f (%.2fx) GB/s"
      % (r, t, m, z, z / m, o, o / m))
EOF
    done
done
