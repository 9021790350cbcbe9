#!/bin/bash
# tools/file_vs_fio.sh - OrbitTE's file endpoint against fio on the same file, in one
# invocation (issue 31's target: ote_bench at >= 0.9x fio).
#
# On one file of SIZE bytes (laid out first with real blocks: a sparse file reads as
# zeros without touching the device), four measurements of RUNTIME seconds each, 1 MiB
# requests at queue depth QD:
#   fio  --ioengine=io_uring --direct=1 --rw=read / --rw=write --bs=1M --iodepth=QD
#   ote_bench --local-mem file:FILE --op read / --op write -b 1M -B 1 --depth QD --sweep
#     (host memory to and from this process's file registration through the local
#     segment: io_uring, O_DIRECT for aligned chunks; file_queue_depth=QD,
#     file_chunk_size=1M; --sweep walks the whole file as fio does)
#   with --peer T (tcp or shm) also, per direction, a peer's requests to the file:
#   ote_bench --transport T --remote-mem file:FILE (the same flags; the spawned target
#     registers the file, this process's host memory is the other end: issue 31's
#     "registered by a peer on the same host" measure, with shm)
# then one line per direction with the rates and the ratios ote_bench / fio:
#   file_vs_fio: read  fio 2.914 GB/s  ote_bench 2.801 GB/s  ratio 0.96
#   file_vs_fio: read  fio 2.914 GB/s  peer over shm 2.650 GB/s  ratio 0.91   (--peer shm)
# fio and ote_bench run one after the other, so a noisy disk shows as spread between
# runs: --rounds N repeats the whole set N times and prints every round.
# GB/s is 10^9 bytes per second. Nothing is asserted: the numbers depend on the device
# and on what else runs (measure on an idle machine, on the file system you care about;
# tmpfs takes no O_DIRECT, so both then go through the page cache).
#
# Usage: tools/file_vs_fio.sh [--ote-bench PATH] [--file PATH] [--size SIZE] [--qd N]
#                             [--runtime SEC] [--peer tcp|shm] [--rounds N]
#   --ote-bench  the ote_bench binary (default: bazel-bin/tools/ote_bench)
#   --file       the file (default: a new one in $TMPDIR, removed at the end; a given
#                file is grown to SIZE with data when shorter, and kept)
#   --size       bytes of the file the runs cover, K/M/G suffix (default 1G)
#   --qd         requests in flight, 1..16 (default 16)
#   --runtime    seconds per measurement (default 5)
#   --peer       also measure a peer's requests to the file over this transport
#   --rounds     how many times to run the whole set (default 1)
# Needs fio (Debian's fio; scripts/deps.sh) and python3 (to read the JSON of both).
set -euo pipefail

BENCH=bazel-bin/tools/ote_bench
FILE=""
SIZE=1G
QD=16
RUNTIME=5
PEER=""
ROUNDS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --ote-bench) BENCH="$2"; shift 2 ;;
        --file) FILE="$2"; shift 2 ;;
        --size) SIZE="$2"; shift 2 ;;
        --qd) QD="$2"; shift 2 ;;
        --runtime) RUNTIME="$2"; shift 2 ;;
        --peer) PEER="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "file_vs_fio: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
done
command -v fio >/dev/null || { echo "file_vs_fio: fio is not installed (scripts/deps.sh)" >&2; exit 2; }
[ -x "$BENCH" ] || { echo "file_vs_fio: no ote_bench at '$BENCH' (--ote-bench)" >&2; exit 2; }
case "$QD" in ''|*[!0-9]*) echo "file_vs_fio: --qd '$QD' is not 1..16" >&2; exit 2 ;; esac
if [ "$QD" -lt 1 ] || [ "$QD" -gt 16 ]; then echo "file_vs_fio: --qd $QD is not 1..16" >&2; exit 2; fi
case "$PEER" in ''|tcp|shm) ;; *) echo "file_vs_fio: --peer '$PEER' is not tcp or shm" >&2; exit 2 ;; esac
case "$ROUNDS" in ''|*[!0-9]*|0) echo "file_vs_fio: --rounds '$ROUNDS' is not a count" >&2; exit 2 ;; esac
BYTES=$(python3 -c '
import sys
s = sys.argv[1]; m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
n = int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)
if n < (16 << 20) or n % (1 << 20): sys.exit("file_vs_fio: --size must be a whole number of MiB, at least 16M")
print(n)' "$SIZE")

TMP=$(mktemp -d "${TMPDIR:-/tmp}/file_vs_fio.XXXXXX")
OWN_FILE=0
if [ -z "$FILE" ]; then FILE="$TMP/data.bin"; OWN_FILE=1; fi
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT

# Real blocks under every byte (a sparse or short file would measure holes).
have=$(stat -c %s "$FILE" 2>/dev/null || echo 0)
if [ "$OWN_FILE" = 1 ] || [ "$have" -lt "$BYTES" ]; then
    fio --name=layout --filename="$FILE" --size="$BYTES" --rw=write --bs=1M --direct=1 \
        --ioengine=io_uring --iodepth="$QD" --output=/dev/null
fi

fio_rate() { # OP -> bytes per second
    fio --name="fio_$1" --filename="$FILE" --size="$BYTES" --rw="$1" --bs=1M --direct=1 \
        --ioengine=io_uring --iodepth="$QD" --runtime="$RUNTIME" --time_based \
        --output-format=json --output="$TMP/fio_$1.json"
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
print(j["bw_bytes"])' "$TMP/fio_$1.json" "$1"
}

ote_rate() { # OP [TRANSPORT] -> bytes per second (local segment, or a peer's requests)
    local where=(--local-mem "file:$FILE")
    if [ -n "${2:-}" ]; then where=(--transport "$2" --remote-mem "file:$FILE"); fi
    OTE_FILE_QUEUE_DEPTH="$QD" OTE_FILE_CHUNK_SIZE=1M "$BENCH" "${where[@]}" \
        --buffer-size "$BYTES" --op "$1" -b 1M -B 1 --depth "$QD" --duration "${RUNTIME}s" \
        --sweep --json --no-progress >"$TMP/ote_$1.json"
    python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).readline())
print(int(r["bytes"] / r["seconds"]))' "$TMP/ote_$1.json"
}

line() { # OP, fio rate, label, rate
    python3 -c 'import sys
op, f, label, o = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ratio = o / f if f > 0 else float("nan")
print("file_vs_fio: %-5s fio %.3f GB/s  %s %.3f GB/s  ratio %.2f" % (op, f / 1e9, label, o / 1e9, ratio))' \
        "$1" "$2" "$3" "$4"
}

echo "file_vs_fio: $FILE, $BYTES bytes, 1 MiB requests, queue depth $QD, ${RUNTIME} s each"
for ((round = 1; round <= ROUNDS; round++)); do
    if [ "$ROUNDS" -gt 1 ]; then echo "file_vs_fio: round $round of $ROUNDS"; fi
    for op in read write; do
        f=$(fio_rate "$op")
        line "$op" "$f" ote_bench "$(ote_rate "$op")"
        if [ -n "$PEER" ]; then line "$op" "$f" "peer over $PEER" "$(ote_rate "$op" "$PEER")"; fi
    done
done
