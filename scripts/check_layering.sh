#!/usr/bin/env bash
# The include layering check; scripts/check_layering.py says what it enforces.
# (It was a bash loop forking sed per #include line: 7 s a pass, 2 min for its self-test.)
#   scripts/check_layering.sh [ROOT] | --self-test
exec python3 "$(dirname "$0")/check_layering.py" "$@"
