#!/usr/bin/env bash
# libmooncake_transfer_engine_compat.so exports exactly the functions that
# compat/mooncake/transfer_engine_c.h declares: each declared function is a defined global
# symbol, and no other global symbol is defined (OrbitTE's own ote_* functions stay local).
# Usage: exports_test.sh LIBRARY HEADER
set -u
lib=$1 header=$2
# Declarations start at column 0 with a return type and name the function before '('.
declared=$(grep -E '^[a-z].*[A-Za-z0-9_]\(' "$header" | grep -vE '^(typedef|extern|#)' |
    sed -E 's/^[^(]*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[A-Z]$/ {print $3}' |
    sed 's/@.*//' | sort -u)
n=$(printf '%s\n' "$declared" | grep -c .)
bad=0
if [ "$n" -ne 27 ]; then
    echo "expected the 27 functions of Mooncake's C API in $header, parsed $n:"
    printf '%s\n' "$declared"
    bad=1
fi
missing=$(comm -23 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
extra=$(comm -13 <(printf '%s\n' "$declared") <(printf '%s\n' "$exported"))
[ -z "$missing" ] || { echo "declared but not exported:"; printf '  %s\n' $missing; bad=1; }
[ -z "$extra" ] || { echo "exported but not declared:"; printf '  %s\n' $extra; bad=1; }
[ "$bad" -eq 0 ] && echo "exports: the $n functions of the header, nothing else"
exit "$bad"
