#!/usr/bin/env bash
# Fails when a source file #includes a header of a package it may not use.
#
# gcc has no layering_check, so Bazel visibility alone cannot stop an upward #include
# (a header is reachable through the include path whether or not the BUILD file lists
# the dependency). This script enforces the same order as //:visibility.bzl:
#
#   tools -> engine -> grant -> endpoint -> qp -> cq -> context -> verbs -> base
#            engine -> cuda -> base
#   tools -> cuda (ote_bench's device buffers), as //:visibility.bzl allows
#   compat -> engine's public headers (<ote/...>, engine/include/) only, and base
#            (compat/mooncake: another engine's API served on OrbitTE's public one)
#   naming -> the same: engine's public headers only, and base (names in etcd/Redis)
#
# and also rejects including another package's *_internal.h or internal/ headers.
#
# Inside engine/ the owner libraries are layered too (see //:visibility.bzl):
#   engine/control      may include base only;
#   engine/<transport>  (tcp, rdma, ...) may include its own files, engine/control, the
#                       transport interface (engine/transport.h), the one source-pin
#                       account every transport keeps (engine/src_account.h, its own
#                       library //engine:src_account), the resolved
#                       configuration (engine/engine_internal.h) and the public headers
#                       (engine/include/, <ote/...>), never another transport or the
#                       engine's other private files;
#   engine              (the files at its top) may include all of engine/.
# <ote/status.h> and <ote/log.h> (base/include/ote/) are the public status and log
# headers, owned by base and re-exported by the engine's API: they depend on nothing
# else, so every package may include them.
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
        tools) echo "tools engine cuda base" ;;
        compat) echo "compat engine base" ;;
        naming) echo "naming engine base" ;;
        *) echo "" ;;
    esac
}
LAYERS="base verbs context cq qp endpoint grant cuda engine tools compat naming"

# Owner inside engine/ of a workspace-relative path: engine/<sub> for a subdirectory
# (other than the public include/), else engine.
engine_owner() {
    local rest=${1#engine/} sub
    sub=${rest%%/*}
    if [ "$sub" != "$rest" ] && [ "$sub" != include ]; then echo "engine/$sub"; else echo engine; fi
}

# Whether a file owned by $1 (engine or engine/<sub>) may include engine path $2.
engine_allowed() {
    local from=$1 inc=$2 to
    to=$(engine_owner "$inc")
    [ "$from" = engine ] && return 0
    [ "$from" = "$to" ] && return 0
    case "$inc" in engine/include/*) return 0 ;; esac
    [ "$from" = engine/control ] && return 1
    [ "$to" = engine/control ] && return 0
    case "$inc" in engine/transport.h | engine/src_account.h | engine/engine_internal.h) return 0 ;; esac
    return 1
}

check_tree() {
    local root=$1 bad=0 pkg f line target inc ok owner
    for pkg in $LAYERS; do
        [ -d "$root/$pkg" ] || continue
        while IFS= read -r -d '' f; do
            while IFS= read -r line; do
                # #include "pkg/..." (quote form, workspace-relative)
                inc=$(printf '%s\n' "$line" | sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p')
                if [ -z "$inc" ]; then
                    # <ote/...> is the engine's public header directory
                    inc=$(printf '%s\n' "$line" | sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<(ote\/[^>]+)>.*/\1/p')
                    if [ "$inc" = ote/status.h ] || [ "$inc" = ote/log.h ]; then inc="base/include/$inc"
                    elif [ -n "$inc" ]; then inc="engine/include/$inc"; fi
                fi
                [ -n "$inc" ] || continue
                target=${inc%%/*}
                [ "$target" = "$inc" ] && continue # same-directory include
                case "$inc" in base/include/ote/status.h | base/include/ote/log.h) continue ;; esac # dependency-free
                case " $LAYERS tests " in *" $target "*) ;; *) continue ;; esac
                ok=0
                for a in $(allowed "$pkg"); do [ "$a" = "$target" ] && ok=1; done
                if [ $ok -eq 0 ]; then
                    echo "layering: ${f#$root/}: '$pkg' may not include \"$inc\" (allowed: $(allowed "$pkg"))"
                    bad=1
                elif [ "$target" != "$pkg" ] && printf '%s' "$inc" | grep -qE '(_internal\.h$|/internal/)'; then
                    echo "layering: ${f#$root/}: '$pkg' includes another package's internal header \"$inc\""
                    bad=1
                elif { [ "$pkg" = compat ] || [ "$pkg" = naming ]; } && [ "$target" = engine ] &&
                    case "$inc" in engine/include/*) false ;; *) true ;; esac; then
                    echo "layering: ${f#$root/}: '$pkg' may include only the engine's public headers (<ote/...>), not \"$inc\""
                    bad=1
                elif [ "$pkg" = engine ] && [ "$target" = engine ]; then
                    owner=$(engine_owner "${f#$root/}")
                    if ! engine_allowed "$owner" "$inc"; then
                        echo "layering: ${f#$root/}: '$owner' may not include \"$inc\" (a transport sees engine/control, engine/transport.h, engine/src_account.h, engine/engine_internal.h and <ote/...> only; control sees base only)"
                        bad=1
                    fi
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
    plant "tcp includes the rdma transport" engine/tcp/planted.c '#include "engine/rdma/test_hook.h"'
    plant "rdma includes the tcp transport" engine/rdma/planted.c '#include "engine/tcp/tcp_internal.h"'
    plant "tcp includes the engine's own objects" engine/tcp/planted.c '#include "engine/core_internal.h"'
    plant "control includes the transport interface" engine/control/planted.c '#include "engine/transport.h"'
    plant "control includes the source account" engine/control/planted.c '#include "engine/src_account.h"'
    plant "shm includes the engine's test hooks" engine/shm/planted.c '#include "engine/hooks.h"'
    plant "compat includes an engine header that is not public" compat/mooncake/planted.c '#include "engine/transport.h"'
    plant "compat includes a transport" compat/mooncake/planted.c '#include "engine/tcp/tcp_internal.h"'
    plant "compat includes the qp layer" compat/mooncake/planted.c '#include "qp/qp.h"'
    plant "naming includes an engine header that is not public" naming/planted.c '#include "engine/transport.h"'
    plant "naming includes the grant layer" naming/planted.c '#include "grant/grant.h"'
    return $fails
}

case "${1:-}" in
    --self-test) self_test ;;
    *) root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
       if check_tree "$root"; then echo "layering: ok"; else exit 1; fi ;;
esac
