"""The layering of OrbitTE as Bazel visibility.

A package may depend only on the packages below it:

    tools -> engine -> grant -> endpoint -> qp -> cq -> context -> verbs -> base
             engine -> cuda -> base

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
    return _pkgs(["tools"]) + _external()

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

def vis_base():
    return ["//visibility:public"]
