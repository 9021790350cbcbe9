#!/usr/bin/env bash
# bw_probe on the fake libcuda: a small run must check its round trip, print the three
# copies with ratios, and exit 0; without a driver it must say "no GPU" and exit 2.
set -u
R="${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/cuda"
out=$(OTE_CUDA_LIBRARY="$R/libfake_cuda.so" "$R/bw_probe" --size 4M --iters 2 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAILED: bw_probe exited $rc on the fake"; exit 1; }
for k in HtoD DtoH DtoD; do
    echo "$out" | grep -Eq "^$k +[0-9.]+ +[0-9.]+ +[0-9.]+x$" || { echo "FAILED: no $k line"; exit 1; }
done
json=$(OTE_CUDA_LIBRARY="$R/libfake_cuda.so" "$R/bw_probe" --size 1M --iters 1 --json)
[ "$(echo "$json" | grep -c '"ratio"')" -eq 3 ] || { echo "FAILED: --json lines: $json"; exit 1; }
out=$(OTE_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$R/bw_probe" 2>&1)
rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "^no GPU:" || { echo "FAILED: no-driver run: rc $rc: $out"; exit 1; }
echo "PASSED"
