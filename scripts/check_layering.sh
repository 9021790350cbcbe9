#!/usr/bin/env bash
# Fails when a source file #includes a header of a package it may not use.
#
# gcc has no layering_check, so Bazel visibility alone cannot stop an upward #include
# (a header is reachable through the include path whether or not the BUILD file lists
# the dependency). This script enforces the same order as //:visibility.bzl:
#
#   tools -> engine -> grant -> endpoint -> qp -> cq -> context -> verbs -> base
#            engine -> cuda -> base
#
# and also rejects including another package's *_internal.h or internal/ headers.
#
# Usage: scripts/check_layering.sh [ROOT]     check the tree at ROOT (default: repo root)
#        scripts/check_layering.sh --self-test plant bad includes in a scratch copy and
#                                              check that each one is caught
set -u

allowed() { # package -> space-separated packages it may include
    case "$1" in
        base) echo "base" ;;
        verbs) echo "verbs base" ;;
        context) echo "context verbs base" ;;
        cq) echo "cq context verbs base" ;;
        qp) echo "qp cq context verbs base" ;;
        endpoint) echo "endpoint qp cq context verbs base" ;;
        grant) echo "grant endpoint qp cq context verbs base" ;;
        cuda) echo "cuda base" ;;
        engine) echo "engine grant endpoint qp cq context verbs cuda base" ;;
        tools) echo "tools engine base" ;;
        *) echo "" ;;
    esac
}
LAYERS="base verbs context cq qp endpoint grant cuda engine tools"

check_tree() {
    local root=$1 bad=0 pkg f line target inc ok
    for pkg in $LAYERS; do
        [ -d "$root/$pkg" ] || continue
        while IFS= read -r -d '' f; do
            while IFS= read -r line; do
                # #include "pkg/..." (quote form, workspace-relative)
                inc=$(printf '%s\n' "$line" | sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p')
                if [ -z "$inc" ]; then
                    # <ote/...> is the engine's public header directory
                    inc=$(printf '%s\n' "$line" | sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<(ote\/[^>]+)>.*/\1/p')
                    [ -n "$inc" ] && inc="engine/include/$inc"
                fi
                [ -n "$inc" ] || continue
                target=${inc%%/*}
                [ "$target" = "$inc" ] && continue # same-directory include
                case " $LAYERS tests " in *" $target "*) ;; *) continue ;; esac
                ok=0
                for a in $(allowed "$pkg"); do [ "$a" = "$target" ] && ok=1; done
                if [ $ok -eq 0 ]; then
                    echo "layering: ${f#$root/}: '$pkg' may not include \"$inc\" (allowed: $(allowed "$pkg"))"
                    bad=1
                elif [ "$target" != "$pkg" ] && printf '%s' "$inc" | grep -qE '(_internal\.h$|/internal/)'; then
                    echo "layering: ${f#$root/}: '$pkg' includes another package's internal header \"$inc\""
                    bad=1
                fi
            done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$f")
        done < <(find "$root/$pkg" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cpp' \) -print0)
    done
    return $bad
}

self_test() {
    local here scratch fails=0
    here=$(cd "$(dirname "$0")/.." && pwd)
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' RETURN
    plant() { # name, file, include line
        rm -rf "$scratch/t" && mkdir -p "$scratch/t"
        for p in $LAYERS; do [ -d "$here/$p" ] && cp -r "$here/$p" "$scratch/t/"; done
        mkdir -p "$scratch/t/$(dirname "$2")"
        printf '%s\n' "$3" >>"$scratch/t/$2"
        if check_tree "$scratch/t" >/dev/null; then
            echo "self-test FAILED: $1 was not caught"
            fails=1
        else
            echo "self-test ok: $1 caught"
        fi
    }
    if ! check_tree "$here" >/dev/null; then echo "self-test: the real tree already fails"; fails=1; fi
    plant "context includes qp" context/planted.c '#include "qp/qp.h"'
    plant "base includes verbs" base/planted.h '#include "verbs/verbs.h"'
    plant "cuda includes verbs (sibling)" cuda/planted.c '#include "verbs/verbs.h"'
    plant "verbs includes the engine API" verbs/planted.c '#include <ote/ote.h>'
    plant "qp includes cq internals" qp/planted.c '#include "cq/cq_internal.h"'
    return $fails
}

case "${1:-}" in
    --self-test) self_test ;;
    *) root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
       if check_tree "$root"; then echo "layering: ok"; else exit 1; fi ;;
esac
