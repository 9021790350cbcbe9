#!/bin/bash
# ote_bench --show-topology on the recorded 8-GPU server (tests/engine/topology/
# server_8gpu.xml through HWLOC_XMLFILE): eight verbs/sim devices named like its NICs,
# two fake GPUs at the bus ids of its GPUs 0 and 6. The engine's ranking is printed per
# GPU (the NIC behind the GPU's own leaf switch first) and per NUMA node; an
# rdma_topology file (OTE_RDMA_TOPOLOGY) replaces what it names; a bad one fails with the
# line named; without RDMA it says so. About a second.
#
# Usage (from Bazel): ote_bench_topology_test.sh <ote_bench> <libfake_cuda.so> <server.xml>
set -u
BENCH="${1:?usage: $0 <ote_bench> <libfake_cuda.so> <server.xml>}"
FAKE="${2:?}"
XML="${3:?}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
FAILED=0
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $1"; }
expect_line() { # output, line, what
    if grep -qxF -- "$2" <<<"$1"; then echo "PASS: $3"; else fail "$3: no line '$2' in:"$'\n'"$1"; fi
}

SIM=""
for k in 0 1 2 3 4 5 6 7; do
    SIM="$SIM${SIM:+;}dev=mlx5_$k,numa=$((k / 4));port;gid=auto-ll,type=v2;gid=auto-v4,type=v2"
done
run() {
    OTE_CUDA_LIBRARY="$FAKE" FAKE_CUDA_DEVICES=2 FAKE_CUDA_PCI_BUS_IDS=0000:16:00.0,0000:d6:00.0 \
        OTE_VERBS_PROVIDER=sim OTE_SIM_CONFIG="$SIM" HWLOC_XMLFILE="$XML" "$BENCH" --show-topology "$@"
}

out=$(run --transport rdma 2>"$TMP/err") || fail "--show-topology exited $?: $(cat "$TMP/err")"
expect_line "$out" "gpu0 0000:16:00.0 pcie: mlx5_0=0 mlx5_1=1 mlx5_2=2 mlx5_3=2 mlx5_4=3 mlx5_5=3 mlx5_6=3 mlx5_7=3" "GPU 0 on its switch's NIC"
expect_line "$out" "gpu1 0000:d6:00.0 pcie: mlx5_6=0 mlx5_7=1 mlx5_4=2 mlx5_5=2 mlx5_0=3 mlx5_1=3 mlx5_2=3 mlx5_3=3" "GPU 1 (the server's GPU 6) on mlx5_6"
expect_line "$out" "numa0 numa: mlx5_0=10 mlx5_1=10 mlx5_2=10 mlx5_3=10 mlx5_4=21 mlx5_5=21 mlx5_6=21 mlx5_7=21" "node 0"
expect_line "$out" "numa1 numa: mlx5_4=10 mlx5_5=10 mlx5_6=10 mlx5_7=10 mlx5_0=21 mlx5_1=21 mlx5_2=21 mlx5_3=21" "node 1"

printf '# cabled elsewhere\ngpu0 mlx5_3\nnuma1 mlx5_7 mlx5_6\n' >"$TMP/topology"
out=$(OTE_RDMA_TOPOLOGY="$TMP/topology" run --transport rdma 2>"$TMP/err") || fail "with a file: exited $?"
expect_line "$out" "gpu0 0000:16:00.0 file: mlx5_3=0 mlx5_0=1 mlx5_1=1 mlx5_2=1 mlx5_4=1 mlx5_5=1 mlx5_6=1 mlx5_7=1" "the file's GPU 0"
expect_line "$out" "gpu1 0000:d6:00.0 pcie: mlx5_6=0 mlx5_7=1 mlx5_4=2 mlx5_5=2 mlx5_0=3 mlx5_1=3 mlx5_2=3 mlx5_3=3" "GPU 1 keeps hwloc's"
expect_line "$out" "numa1 file: mlx5_7=0 mlx5_6=1 mlx5_0=2 mlx5_1=2 mlx5_2=2 mlx5_3=2 mlx5_4=2 mlx5_5=2" "the file's node 1"

printf 'gpu0 mlx5_3\nswitch0 mlx5_1\n' >"$TMP/bad"
if OTE_RDMA_TOPOLOGY="$TMP/bad" run --transport rdma >"$TMP/out" 2>"$TMP/err"; then
    fail "a bad rdma_topology file did not fail"
elif grep -qF "line 2: \"switch0\" is not gpu<N> or numa<N>" "$TMP/err"; then
    echo "PASS: a bad file fails, naming its line"
else
    fail "a bad file's message: $(cat "$TMP/err")"
fi

out=$(run 2>/dev/null) || fail "tcp: exited $?"
expect_line "$out" "no device ranking: the engine has no RDMA transport (--transport rdma)" "tcp only"

[ "$FAILED" -eq 0 ] || { echo "$FAILED check(s) failed"; exit 1; }
echo "all checks passed"
