"""The layering of OrbitTE as Bazel visibility.

A package may depend only on the packages below it:

    tools -> engine -> grant -> endpoint -> qp -> cq -> context -> verbs -> base
             engine -> cuda -> base
    compat -> engine (its public header <ote/ote.h> only), base
    naming -> engine (its public header <ote/ote.h> only), base

Inside engine/ the same holds between its owner libraries:

    //engine (public API: the lifecycle, engine.c)
        -> the core's owner libraries, each vis_engine_internal (engine/DESIGN.md):
           :batch -> :notify, :registry; :discover, :shared_mem, :registry -> :router
           -> :listener -> :core
        -> //engine/tcp, //engine/rdma, //engine/shm (one library per transport; never
           each other; only :router depends on them)
        -> //engine:transport_api, //engine:config, //engine/control, //engine:api

Each layer's targets are visible only to the layers above it (and to //tests), so an
upward or sideways dependency fails the build with "is not visible". //base, //verbs,
//cuda and //engine are also usable from an outside workspace that pulls OrbitTE in with
local_repository: when OrbitTE is not the main repository, those four are visible to the
main repository's packages ("@//"). When OrbitTE is itself the main repository that
label would name OrbitTE's own packages, so it is left out and the layering holds.
"""

def _pkgs(names):
    return ["//%s:__subpackages__" % n for n in names] + ["//tests:__subpackages__"]

def _external():
    if native.repository_name() == "@":
        return []
    return ["@//:__subpackages__"]

def vis_tools():
    return _pkgs([])

def vis_engine():
    return _pkgs(["tools", "compat", "naming"]) + _external()

def vis_compat():
    """//compat/*: APIs of other engines served by OrbitTE, on //engine's public API; on
    top, nothing in OrbitTE depends on them (only //tests, and an outside workspace)."""
    return _pkgs([]) + _external()

def vis_naming():
    """//naming: names in etcd/Redis on //engine's public API; on top like //compat, nothing
    in OrbitTE's core depends on it (only //tests, and an outside workspace)."""
    return _pkgs([]) + _external()

def _engine_inside():
    return ["//engine:__subpackages__", "//tests:__subpackages__"]

def vis_engine_api():
    """//engine:api, the public headers <ote/*.h>: everything in engine/ and tools, and
    //naming's shared library (built against the header, the engine from liborbitte.so)."""
    return _engine_inside() + ["//tools:__subpackages__", "//naming:__pkg__"]

def vis_engine_internal():
    """//engine:config, //engine:transport_api and the core's owner libraries (:core,
    :listener, :router, :registry, ...): the engine and its transports."""
    return _engine_inside()

def vis_engine_control():
    """//engine/control, the wire codec and handshake: the engine and its transports."""
    return _engine_inside()

def vis_engine_transport():
    """//engine/tcp, //engine/rdma, //engine/shm: only //engine composes a transport; a transport
    never sees another one."""
    return ["//engine:__pkg__", "//tests:__subpackages__"]

def vis_grant():
    return _pkgs(["engine", "tools"])

def vis_endpoint():
    return _pkgs(["grant", "engine", "tools"])

def vis_qp():
    return _pkgs(["endpoint", "grant", "engine", "tools"])

def vis_cq():
    return _pkgs(["qp", "endpoint", "grant", "engine", "tools"])

def vis_context():
    return _pkgs(["cq", "qp", "endpoint", "grant", "engine", "tools"])

def vis_verbs():
    return _pkgs(["context", "cq", "qp", "endpoint", "grant", "engine", "tools"]) + _external()

def vis_cuda():
    return _pkgs(["engine", "tools"]) + _external()

def vis_cuda_layer(upper):
    """A library inside cuda/: visible to the cuda/ subpackages named in upper (the owners
    built on it), to the //cuda umbrella, and to what may see //cuda.

    cuda/ is layered inside too: driver (//cuda:driver) -> memory -> pinned -> stream, and
    memory -> ipc; a subpackage sees only those below it.
    """
    return ["//cuda/%s:__pkg__" % u for u in upper] + ["//cuda:__pkg__"] + vis_cuda()

def vis_base():
    return ["//visibility:public"]
