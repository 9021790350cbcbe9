#!/usr/bin/env bash
# The main job: installs what OrbitTE needs on Debian 12, builds ote_bench optimised and
# runs it. With no --target it starts its own target process on loopback, so it works on
# a fresh machine with no setup. Arguments go to ote_bench (see --help). With no
# arguments it runs the default sweep twice, over tcp and over the same-host transport
# shm, one table each.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
if [ "$#" -gt 0 ]; then
    exec bazel run --ui_event_filters=-info --noshow_progress //tools:ote_bench -- "$@"
fi
bazel build --ui_event_filters=-info --noshow_progress //tools:ote_bench
BENCH="$(bazel info bazel-bin 2>/dev/null)/tools/ote_bench"
"$BENCH" --transport tcp
echo
"$BENCH" --transport shm
