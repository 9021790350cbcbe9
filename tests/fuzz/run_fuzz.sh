#!/bin/bash
# tests/fuzz/run_fuzz.sh - build the control-plane libFuzzer targets with Debian's clang
# (the frame codec and handshake checks; the RDMA transport's message codec; the shm
# transport's wire checks, its HELLO and AUTH steps included; the naming value envelope)
# and run each for a bounded time. Exits non-zero when clang fails or a fuzzer finds a crash, a sanitizer report or
# a leak.
#
# Regression mode (seconds 0): each target runs once over its seeds and over the inputs
# kept in tests/fuzz/regress/<target>/ (inputs that once found a bug), without fuzzing.
#
#   tests/fuzz/run_fuzz.sh [seconds]        (from the repository root, or as a Bazel test)
set -euo pipefail

SECS="${1:-${OTE_FUZZ_SECONDS:-20}}"
if [[ -n "${TEST_SRCDIR:-}" ]]; then
    ROOT="${TEST_SRCDIR}/${TEST_WORKSPACE:-orbitte}"
else
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fi
WORK="${TEST_TMPDIR:-$(mktemp -d)}"
CLANG="${CLANG:-clang}"
command -v "$CLANG" >/dev/null || { echo "run_fuzz: $CLANG not found (apt-get install clang)"; exit 2; }

BIN="$WORK/ctl_fuzz"
"$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$ROOT" \
    "$ROOT/engine/control/fuzz_decode.c" "$ROOT/engine/control/ctl.c" -o "$BIN"

CORPUS="$WORK/corpus"
mkdir -p "$CORPUS"
# Seeds: a HELLO, a WRITE_REQ with 4 data bytes, a READ_RESP error (little endian).
printf 'OTEM\x01\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x01\x00\x01\x00\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00h:12' >"$CORPUS/hello"
# The same HELLO from an engine named "p0" (engine_name: NUL, name, NUL after the address).
printf 'OTEM\x01\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x18\x00\x00\x00\x01\x00\x01\x00\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00h:12\x00p0\x00' >"$CORPUS/hello_named"
printf 'OTEM\x01\x00\x03\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00abcd' >"$CORPUS/write"
printf 'OTEM\x01\x00\x06\x00\x05\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00' >"$CORPUS/readresp"
# Buffer discovery: a BUFS_REQ, then a BUFS frame listing one entry (0x1000, 64 bytes,
# READ|WRITE, host, name "kv").
printf 'OTEM\x02\x00\x0c\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' >"$CORPUS/bufsreq"
{
    printf 'OTEM\x02\x00\x0d\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x60\x00\x00\x00'
    printf '\x02\x00\x00\x00\x01\x00\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00'
    printf 'kv'
    head -c 62 /dev/zero
} >"$CORPUS/bufs"
# An engine metadata blob (ote_engine_metadata): "OTMD", version 1, address "h:12", epoch
# 0x0102030405060708, one entry (0x1000, 64 bytes, READ|WRITE, host, name "kv").
{
    printf 'OTMD\x01\x00\x04\x00\x08\x07\x06\x05\x04\x03\x02\x01\x01\x00\x00\x00h:12'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00'
    printf 'kv'
    head -c 62 /dev/zero
} >"$CORPUS/metadata"
# The same blob from an engine named "p0" (version 2: the name's length u16, then the name).
{
    printf 'OTMD\x02\x00\x04\x00\x08\x07\x06\x05\x04\x03\x02\x01\x01\x00\x00\x00h:12'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00'
    printf 'kv'
    head -c 62 /dev/zero
    printf '\x02\x00p0'
} >"$CORPUS/metadata_named"
# An unnamed engine's blob with a file registration (version 3: the entry's kind is 2, a
# file; the name section is there, of length 0).
{
    printf 'OTMD\x03\x00\x04\x00\x08\x07\x06\x05\x04\x03\x02\x01\x01\x00\x00\x00h:12'
    printf '\x00\x10\x00\x00\x00\x00\x00\xf0\x40\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x02\x00\x00\x00'
    printf 'kv'
    head -c 62 /dev/zero
    printf '\x00\x00'
} >"$CORPUS/metadata_files"
# Authentication (version 3): an AUTH PROOF (step 2) with a nonce of 0x11 and a MAC of 0x22.
{
    printf 'OTEM\x03\x00\x0e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x48\x00\x00\x00'
    printf '\x02\x00\x00\x00\x00\x00\x00\x00'
    head -c 32 /dev/zero | tr '\0' '\021'
    head -c 32 /dev/zero | tr '\0' '\042'
} >"$CORPUS/auth"

# The RDMA transport's message codec (engine/rdma/proto.h): one OTE_CTL_RDMA body per
# input. Seeds: INFO in its short form (an engine without epochs), INFO with one device
# and the epoch 0x0123456789abcdef, GRANT_REQ (WRITE, 4096 bytes at 0x1000) with pair 0
# and the source's epoch 0x1122334455667788, CONNECT with both epochs.
RBIN="$WORK/rp_fuzz"
"$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$ROOT" \
    "$ROOT/engine/rdma/fuzz_proto.c" "$ROOT/engine/rdma/proto.c" -o "$RBIN"
RCORPUS="$WORK/rp_corpus"
mkdir -p "$RCORPUS"
INFO_HEAD='\x01\x00\x00\x00\xef\xcd\xab\x90\x78\x56\x34\x12\x42\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x02\x00\x00\x00'
printf "$INFO_HEAD" >"$RCORPUS/info_short"
{
    printf "$INFO_HEAD"
    printf '\x01\x00\x00\x00\x07\x00\x00\x00'
    head -c 28 /dev/zero
    printf '\xef\xcd\xab\x89\x67\x45\x23\x01'
} >"$RCORPUS/info_epoch"
{
    printf '\x05\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x63\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
    printf '\x88\x77\x66\x55\x44\x33\x22\x11'
} >"$RCORPUS/grant_epoch"
# CONNECT (WRITE, slot 1, pair 0, QP 0x100, MTU 1024) with the source's epoch
# 0x1122334455667788 and the requester's 0x0123456789abcdef.
{
    printf '\x03\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00'
    head -c 20 /dev/zero
    printf '\x00\x01\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00'
    printf '\x88\x77\x66\x55\x44\x33\x22\x11\xef\xcd\xab\x89\x67\x45\x23\x01'
} >"$RCORPUS/connect_epoch"

# ... and the same GRANT_REQ asked on a direct slot by a requester that follows a
# redirect (op word 0x301: GPUDirect source grants, proto.h).
{
    printf '\x05\x00\x00\x00\x00\x00\x00\x00\x01\x03\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x63\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
    printf '\x88\x77\x66\x55\x44\x33\x22\x11'
} >"$RCORPUS/grant_direct"

# ... and the GRANT_REQ with the epoch, no flags and the parent trailer (parent 7 of a
# budget of 4 grants: whole-parent credits, proto.h).
{
    printf '\x05\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x00\x10\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00'
    printf '\x63\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
    printf '\x88\x77\x66\x55\x44\x33\x22\x11\x00\x00\x00\x00'
    printf '\x07\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00'
} >"$RCORPUS/grant_parent"

# GRANT_RESP in the pair form (rkey 0x1234, not staged, the source's device 1 best for
# the registration at 0x10000 of 1 MiB: remote locality, proto.h).
{
    printf '\x06\x00\x00\x00\x34\x12\x00\x00\x00\x00\x00\x00'
    head -c 8 /dev/zero
    printf '\x02\x00\x00\x00\x00\x00\x00\x00'
    printf '\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00'
} >"$RCORPUS/resp_pair"

# The shm transport's wire checks (engine/shm/shm_proto.h): one SOCK_SEQPACKET message
# per input. Seeds (a HELLO, the three AUTH steps, HELLO_ACKs, REQS, RESPS, an IPC offer
# and close receipt, and malformed neighbours of them) are written by the target itself
# built with -DOTE_SHM_FUZZ_SEEDS, so they follow the structs' layout.
SBIN="$WORK/shm_fuzz"
SFLAGS=(-std=c11 -D_GNU_SOURCE -DOTE__INSIDE_ENGINE -g -O1 -I"$ROOT" -I"$ROOT/engine/include" -I"$ROOT/base/include")
"$CLANG" "${SFLAGS[@]}" -DOTE_SHM_FUZZ_SEEDS -fsanitize=address,undefined \
    -fno-sanitize-recover=undefined \
    "$ROOT/engine/shm/fuzz_shm.c" "$ROOT/engine/shm/shm_proto.c" -o "$WORK/shm_seeds"
"$CLANG" "${SFLAGS[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "$ROOT/engine/shm/fuzz_shm.c" "$ROOT/engine/shm/shm_proto.c" -o "$SBIN"
SCORPUS="$WORK/shm_corpus"
mkdir -p "$SCORPUS"
"$WORK/shm_seeds" "$SCORPUS"

# The value stored under a name (naming/value.c: the OTNM envelope around an engine
# metadata blob). Seeds: "decode-3" around the metadata seeds above (versions 1, 2 and
# 3), and the envelope of version 2 (refused) around the first.
NBIN="$WORK/nval_fuzz"
"$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$ROOT" -I"$ROOT/naming/include" \
    -I"$ROOT/engine/include" -I"$ROOT/base/include" \
    "$ROOT/tests/fuzz/nval_fuzz.c" "$ROOT/naming/value.c" "$ROOT/engine/control/ctl.c" \
    "$ROOT/engine/md_decode.c" "$ROOT/base/alloc.c" -o "$NBIN"
NCORPUS="$WORK/nval_corpus"
mkdir -p "$NCORPUS"
nval() { # version, metadata file, output
    local ml
    ml=$(wc -c <"$2")
    {
        printf 'OTNM'
        printf "\\x$(printf %02x "$1")\\x00\\x08\\x00"
        printf "\\x$(printf %02x $((ml & 255)))\\x$(printf %02x $((ml >> 8)))\\x00\\x00"
        printf 'decode-3'
        cat "$2"
    } >"$3"
}
nval 1 "$CORPUS/metadata" "$NCORPUS/value"
nval 1 "$CORPUS/metadata_named" "$NCORPUS/value_named"
nval 1 "$CORPUS/metadata_files" "$NCORPUS/value_files"
nval 2 "$CORPUS/metadata" "$NCORPUS/value_v2"

# Kept inputs of each target (regress/<name>/) join its corpus.
for kept in ctl_fuzz:"$CORPUS" rp_fuzz:"$RCORPUS" shm_fuzz:"$SCORPUS" nval_fuzz:"$NCORPUS"; do
    dir="$ROOT/tests/fuzz/regress/${kept%%:*}"
    if [[ -d "$dir" ]]; then
        for f in "$dir"/*; do [[ -f "$f" ]] && cp "$f" "${kept#*:}/regress_$(basename "$f")"; done
    fi
done

cd "$WORK"
fail=0
for run in "$BIN $CORPUS 8192" "$RBIN $RCORPUS 128" "$SBIN $SCORPUS 2048" "$NBIN $NCORPUS 4096"; do
    set -- $run
    set +e
    if [[ "$SECS" == 0 ]]; then
        # Each input once (libFuzzer runs the files it is given and stops).
        "$1" -rss_limit_mb=2048 "$2"/* 2>&1 | tail -n 5
    else
        "$1" -max_total_time="$SECS" -rss_limit_mb=2048 -max_len="$3" -print_final_stats=1 "$2" 2>&1 | tail -n 25
    fi
    rc=${PIPESTATUS[0]}
    set -e
    if [[ $rc -ne 0 ]]; then
        echo "run_fuzz: $(basename "$1") FAILED (exit $rc); crash inputs are in $WORK"
        fail=1
    fi
done
if [[ $fail -ne 0 ]]; then
    echo "0 passed, 1 failed"
    exit 1
fi
if [[ "$SECS" == 0 ]]; then
    echo "run_fuzz: no crash over the seeds and kept inputs of each target"
else
    echo "run_fuzz: no crash in ${SECS}s per target"
fi
echo "1 passed, 0 failed"
