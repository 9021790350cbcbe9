#!/usr/bin/env bash
# Fails when a C, C++ or header file of the project is not formatted as .clang-format says
# (clang-format from Debian's clang-format package; installed here when missing).
# Prints the files that differ; `scripts/check_format.sh --fix` rewrites them in place.
set -u
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        --no-install-recommends clang-format >/dev/null || { echo "format: cannot install clang-format"; exit 1; }
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cc' | grep -v '^third_party/')
if [ "${1:-}" = "--fix" ]; then
    clang-format -i "${files[@]}"
    exit 0
fi
bad=0
for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "format: $f is not formatted (run scripts/check_format.sh --fix)"
        bad=$((bad + 1))
    fi
done
echo "format: ${#files[@]} files checked, $bad not formatted"
[ "$bad" -eq 0 ]
