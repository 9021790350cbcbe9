#!/usr/bin/env bash
# The main job: installs what OrbitTE needs on Debian 12, builds ote_bench optimised and
# runs it. With no --target it starts its own target process on loopback, so it works on
# a fresh machine with no setup. Arguments go to ote_bench (see --help).
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
exec bazel run --ui_event_filters=-info --noshow_progress //tools:ote_bench -- "$@"
