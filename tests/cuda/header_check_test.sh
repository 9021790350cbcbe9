#!/usr/bin/env bash
# Compiles tests/cuda/header_check.cc against the CUDA Toolkit's cuda.h (static asserts:
# cuda/driver.h's values, sizes, layouts and entry point signatures are the real ones).
# Where no cuda.h is installed it says so and passes as a skip: there is nothing to
# compare with (gtest-style "SKIPPED" line for the result counter).
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-}" 2>/dev/null || true
inc=""
for d in "${CUDA_HOME:-}/include" /usr/local/cuda/include /usr/include; do
    if [ -f "$d/cuda.h" ]; then inc="$d"; break; fi
done
if [ -z "$inc" ]; then
    echo "[  SKIPPED ] header check: no cuda.h (CUDA_HOME, /usr/local/cuda/include, /usr/include)"
    exit 0
fi
cxx=$(command -v g++ || command -v clang++ || true)
if [ -z "$cxx" ]; then
    echo "[  SKIPPED ] header check: no C++ compiler"
    exit 0
fi
echo "checking cuda/driver.h against $inc/cuda.h with $cxx"
# driver.h needs only the ote_status_t typedef from base/status.h (another package's
# file); where the real one is not in the runfiles a one-line stand-in provides it.
stub=""
if [ ! -f base/status.h ]; then
    stub=$(mktemp -d)
    mkdir -p "$stub/base"
    printf '#ifndef OTE_BASE_STATUS_H\n#define OTE_BASE_STATUS_H\n#include <stdint.h>\ntypedef int32_t ote_status_t;\n#endif\n' >"$stub/base/status.h"
fi
if "$cxx" -std=c++17 -fsyntax-only -Wall -Werror -I. ${stub:+-I"$stub"} -isystem "$inc" tests/cuda/header_check.cc; then
    echo "[       OK ] cuda/driver.h matches $inc/cuda.h"
    exit 0
fi
echo "[  FAILED  ] cuda/driver.h does not match $inc/cuda.h"
exit 1
