#!/usr/bin/env python3
"""Fails when a source file #includes a header of a package it may not use.

gcc has no layering_check, so Bazel visibility alone cannot stop an upward #include (a
header is reachable through the include path whether or not the BUILD file lists the
dependency). This check enforces the same order as //:visibility.bzl:

  tools -> engine -> grant -> endpoint -> qp -> cq -> context -> verbs -> base
           engine -> cuda -> base
  tools -> cuda (ote_bench's device buffers), as //:visibility.bzl allows
  compat -> engine's public headers (<ote/...>, engine/include/) only, and base
           (compat/mooncake: another engine's API served on OrbitTE's public one)
  naming -> the same: engine's public headers only, and base (names in etcd/Redis)

and also rejects including another package's *_internal.h or internal/ headers.

Inside engine/ the owner libraries are layered too (see //:visibility.bzl):
  engine/control      may include base only;
  engine/<transport>  (tcp, rdma, ...) may include its own files, engine/control, the
                      transport interface (engine/transport.h), the one source-pin account
                      every transport keeps (engine/src_account.h, its own library
                      //engine:src_account), the resolved configuration
                      (engine/engine_internal.h) and the public headers (engine/include/,
                      <ote/...>), never another transport or the engine's other private
                      files;
  engine              (the files at its top) may include all of engine/.
<ote/status.h> and <ote/log.h> (base/include/ote/) are the public status and log headers,
owned by base and re-exported by the engine's API: they depend on nothing else, so every
package may include them.

Usage: scripts/check_layering.py [ROOT]     check the tree at ROOT (default: repo root)
       scripts/check_layering.py --self-test plant bad includes in a scratch copy of the
                                             tree and check that each one is caught
"""
import os
import re
import shutil
import sys
import tempfile

ALLOWED = {
    "base": ["base"],
    "verbs": ["verbs", "base"],
    "context": ["context", "verbs", "base"],
    "cq": ["cq", "context", "verbs", "base"],
    "qp": ["qp", "cq", "context", "verbs", "base"],
    "endpoint": ["endpoint", "qp", "cq", "context", "verbs", "base"],
    "grant": ["grant", "endpoint", "qp", "cq", "context", "verbs", "base"],
    "cuda": ["cuda", "base"],
    "engine": ["engine", "grant", "endpoint", "qp", "cq", "context", "verbs", "cuda", "base"],
    "tools": ["tools", "engine", "cuda", "base"],
    "compat": ["compat", "engine", "base"],
    "naming": ["naming", "engine", "base"],
}
LAYERS = list(ALLOWED)
DEPENDENCY_FREE = ("base/include/ote/status.h", "base/include/ote/log.h")
SOURCE_SUFFIXES = (".c", ".h", ".cc", ".cpp")
QUOTE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ANGLE_RE = re.compile(r"^\s*#\s*include\s*<(ote/[^>]+)>")
INTERNAL_RE = re.compile(r"(_internal\.h$|/internal/)")
TRANSPORT_VISIBLE = ("engine/transport.h", "engine/src_account.h", "engine/engine_internal.h")


def engine_owner(path):
    """Owner inside engine/ of a workspace-relative path: engine/<sub> for a
    subdirectory other than the public include/, else engine."""
    rest = path[len("engine/"):]
    sub, sep, _ = rest.partition("/")
    return "engine/" + sub if sep and sub != "include" else "engine"


def engine_allowed(owner, inc):
    """Whether a file owned by `owner` (engine or engine/<sub>) may include `inc`."""
    to = engine_owner(inc)
    if owner == "engine" or owner == to or inc.startswith("engine/include/"):
        return True
    if owner == "engine/control":
        return False
    return to == "engine/control" or inc in TRANSPORT_VISIBLE


def included_path(line):
    """The workspace-relative path a line #includes, or None."""
    m = QUOTE_RE.match(line)
    if m:
        return m.group(1)
    m = ANGLE_RE.match(line)
    if not m:
        return None
    inc = m.group(1)
    if inc in ("ote/status.h", "ote/log.h"):
        return "base/include/" + inc
    return "engine/include/" + inc


def check_include(pkg, rel, inc):
    """The complaint about `rel` (in package `pkg`) including `inc`, or None."""
    target = inc.split("/", 1)[0]
    if target == inc or inc in DEPENDENCY_FREE:
        return None  # same-directory include, or dependency-free public header
    if target not in LAYERS and target != "tests":
        return None
    allowed = ALLOWED[pkg]
    if target not in allowed:
        return "'%s' may not include \"%s\" (allowed: %s)" % (pkg, inc, " ".join(allowed))
    if target != pkg and INTERNAL_RE.search(inc):
        return "'%s' includes another package's internal header \"%s\"" % (pkg, inc)
    if pkg in ("compat", "naming") and target == "engine" and not inc.startswith("engine/include/"):
        return ("'%s' may include only the engine's public headers (<ote/...>), not \"%s\""
                % (pkg, inc))
    if pkg == "engine" and target == "engine":
        owner = engine_owner(rel)
        if not engine_allowed(owner, inc):
            return ("'%s' may not include \"%s\" (a transport sees engine/control, "
                    "engine/transport.h, engine/src_account.h, engine/engine_internal.h and "
                    "<ote/...> only; control sees base only)" % (owner, inc))
    return None


def check_tree(root):
    """Prints one line per violation under `root`; returns the number of violations."""
    bad = 0
    for pkg in LAYERS:
        top = os.path.join(root, pkg)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        inc = included_path(line)
                        why = inc and check_include(pkg, rel, inc)
                        if why:
                            print("layering: %s: %s" % (rel, why))
                            bad += 1
    return bad


PLANTS = [
    ("context includes qp", "context/planted.c", '#include "qp/qp.h"'),
    ("base includes verbs", "base/planted.h", '#include "verbs/verbs.h"'),
    ("cuda includes verbs (sibling)", "cuda/planted.c", '#include "verbs/verbs.h"'),
    ("verbs includes the engine API", "verbs/planted.c", "#include <ote/ote.h>"),
    ("qp includes cq internals", "qp/planted.c", '#include "cq/cq_internal.h"'),
    ("tcp includes the rdma transport", "engine/tcp/planted.c",
     '#include "engine/rdma/test_hook.h"'),
    ("rdma includes the tcp transport", "engine/rdma/planted.c",
     '#include "engine/tcp/tcp_internal.h"'),
    ("tcp includes the engine's own objects", "engine/tcp/planted.c",
     '#include "engine/core_internal.h"'),
    ("control includes the transport interface", "engine/control/planted.c",
     '#include "engine/transport.h"'),
    ("control includes the source account", "engine/control/planted.c",
     '#include "engine/src_account.h"'),
    ("shm includes the engine's test hooks", "engine/shm/planted.c", '#include "engine/hooks.h"'),
    ("compat includes an engine header that is not public", "compat/mooncake/planted.c",
     '#include "engine/transport.h"'),
    ("compat includes a transport", "compat/mooncake/planted.c",
     '#include "engine/tcp/tcp_internal.h"'),
    ("compat includes the qp layer", "compat/mooncake/planted.c", '#include "qp/qp.h"'),
    ("naming includes an engine header that is not public", "naming/planted.c",
     '#include "engine/transport.h"'),
    ("naming includes the grant layer", "naming/planted.c", '#include "grant/grant.h"'),
]


def self_test(here):
    """Plants each bad include in a fresh scratch copy of the layers; each must be caught,
    and the real tree must pass. Returns 0 when all hold."""
    fails = 0
    if check_tree(here):
        print("self-test: the real tree already fails")
        fails = 1
    with tempfile.TemporaryDirectory() as scratch:
        for what, rel, line in PLANTS:
            tree = os.path.join(scratch, "t")
            shutil.rmtree(tree, ignore_errors=True)
            for pkg in LAYERS:
                if os.path.isdir(os.path.join(here, pkg)):
                    shutil.copytree(os.path.join(here, pkg), os.path.join(tree, pkg), symlinks=True)
            os.makedirs(os.path.dirname(os.path.join(tree, rel)), exist_ok=True)
            with open(os.path.join(tree, rel), "a", encoding="utf-8") as f:
                f.write(line + "\n")
            with open(os.devnull, "w") as sink:
                saved, sys.stdout = sys.stdout, sink
                try:
                    caught = check_tree(tree) > 0
                finally:
                    sys.stdout = saved
            print("self-test %s: %s %s" % ("ok" if caught else "FAILED", what,
                                           "caught" if caught else "was not caught"))
            fails |= not caught
    return fails


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if argv[1:2] == ["--self-test"]:
        return self_test(here)
    root = argv[1] if len(argv) > 1 else here
    if check_tree(root):
        return 1
    print("layering: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
