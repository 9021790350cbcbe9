"""liborbitte.so exports exactly the public C API, and Python finds it as documented."""

import os
import re
import shutil
import subprocess
import sys

import orbitte
from orbitte import _lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADERS = [os.path.join(REPO, "engine", "include", "ote", "ote.h"),
           os.path.join(REPO, "base", "include", "ote", "status.h"),
           os.path.join(REPO, "base", "include", "ote", "log.h")]


def declared_functions():
    """Functions the public headers declare (static inline helpers are not symbols)."""
    names = set()
    for path in HEADERS:
        text = open(path).read()
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        for m in re.finditer(r"^(?!static)[A-Za-z_][\w \*]*?\b(ote_\w+)\s*\(", text, re.M):
            names.add(m.group(1))
    return names


def exported_functions(path):
    out = subprocess.run(["nm", "-D", "--defined-only", "--extern-only", path],
                         check=True, capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_exports_exactly_the_public_api():
    declared = declared_functions()
    assert "ote_batch_wait" in declared and "ote_status_code" not in declared
    assert exported_functions(orbitte.library_path) == declared


def test_no_test_hook_ships():
    """Test hooks live in test-only libraries (//engine:testing): nothing in the shipped
    library reads an OTE_TEST_* variable or carries the RDMA test counters."""
    data = open(orbitte.library_path, "rb").read()
    assert b"OTE_TEST_" not in data
    assert b"ote__rdma_test_grants" not in data


def test_binding_declares_what_the_library_exports():
    """Every exported function has a ctypes prototype, so none is called untyped."""
    missing = exported_functions(orbitte.library_path) - set(_lib.PUBLIC_FUNCTIONS)
    assert missing == set(), "functions without a prototype in orbitte/_lib.py: %s" % missing


def _import_in_child(pythonpath, env_lib):
    env = {k: v for k, v in os.environ.items() if k != "ORBITTE_LIBRARY"}
    env["PYTHONPATH"] = pythonpath
    if env_lib is not None:
        env["ORBITTE_LIBRARY"] = env_lib
    return subprocess.run([sys.executable, "-c", "import orbitte; print(orbitte.library_path)"],
                          env=env, capture_output=True, text=True, timeout=120,
                          cwd=pythonpath)


def test_library_search_order(tmp_path):
    pkg = tmp_path / "orbitte"
    shutil.copytree(os.path.dirname(orbitte.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # 1. ORBITTE_LIBRARY wins, and a wrong one is an ImportError naming it
    r = _import_in_child(str(tmp_path), orbitte.library_path)
    assert r.returncode == 0 and r.stdout.strip() == orbitte.library_path
    r = _import_in_child(str(tmp_path), str(tmp_path / "missing.so"))
    assert r.returncode != 0 and "ORBITTE_LIBRARY" in r.stderr and "missing.so" in r.stderr
    # with no library anywhere the error says where it looked and how to build it
    r = _import_in_child(str(tmp_path), None)
    assert r.returncode != 0 and "scripts/python.sh" in r.stderr
    assert "package directory" in r.stderr and "bazel-bin" in r.stderr
    # 2. the package directory
    shutil.copy(orbitte.library_path, pkg / "liborbitte.so")
    r = _import_in_child(str(tmp_path), None)
    assert r.returncode == 0 and r.stdout.strip() == str(pkg / "liborbitte.so")
    # 3. bazel-bin of the source tree the package sits in
    src_tree = tmp_path / "tree"
    (src_tree / "python").mkdir(parents=True)
    shutil.copytree(os.path.dirname(orbitte.__file__), src_tree / "python" / "orbitte",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (src_tree / "bazel-bin" / "engine").mkdir(parents=True)
    shutil.copy(orbitte.library_path, src_tree / "bazel-bin" / "engine" / "liborbitte.so")
    r = _import_in_child(str(src_tree / "python"), None)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(src_tree / "bazel-bin" / "engine" / "liborbitte.so")


def _dynamic_section(path):
    return subprocess.run(["readelf", "-d", path], check=True, capture_output=True,
                          text=True).stdout


def _header_version():
    text = open(HEADERS[0]).read()
    parts = [re.search(r"#define OTE_VERSION_%s (\d+)" % p, text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_versions_agree():
    """ote.h's OTE_VERSION_*, ote_version(), orbitte.__version__ and the SONAME's major."""
    v = _header_version()
    assert orbitte.library_version() == v
    assert orbitte.__version__ == v
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.*?)\]",
                       _dynamic_section(orbitte.library_path))
    assert soname is not None, "liborbitte.so has no SONAME"
    assert soname.group(1) == "liborbitte.so.%s" % v.split(".")[0]


def test_no_needless_dependencies():
    """A C11 library: no C++ runtime; libibverbs is loaded at run time (verbs/ibverbs_dl.h),
    so tcp and shm users need no rdma-core, and no ibv_ symbol is left undefined."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*?)\]",
                        _dynamic_section(orbitte.library_path))
    assert not [n for n in needed if "stdc++" in n or "ibverbs" in n or "mlx5" in n], needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", orbitte.library_path],
                               check=True, capture_output=True, text=True).stdout
    assert not re.search(r"\bibv_|\b_ibv_", undefined), undefined


def test_features():
    f = orbitte.features()
    assert {"verbs_sim", "auth"} <= f
    assert f <= {"rdma_core", "verbs_sim", "cuda", "auth"}


def _features_in_child(env_extra):
    env = dict(os.environ, **env_extra)
    code = "import orbitte; print(sorted(orbitte.features()))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_features_follow_the_libraries_found():
    """rdma_core and cuda say whether each library loads: pointed at a missing file they
    are absent (tests/engine:version_test checks present ones, with the fake driver)."""
    missing = _features_in_child({"OTE_IBVERBS_LIBRARY": "/nonexistent/libibverbs.so.1",
                                  "OTE_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"})
    assert "rdma_core" not in missing and "cuda" not in missing


def test_rdma_without_libibverbs_fails_naming_the_library():
    """transports=rdma over rdma-core on a machine without libibverbs: engine creation
    fails with a status and an ERROR naming the library; tcp in the same process works."""
    code = """
import orbitte
try:
    orbitte.Engine({"transports": "rdma", "verbs_provider": "rdma-core", "log_level": "error"})
except orbitte.OrbitteError as e:
    print("refused", e.name)
with orbitte.Engine({"transports": "tcp"}) as a, orbitte.Engine({"transports": "tcp"}) as b:
    buf = bytearray(b"x" * 4096)
    reg = b.register(bytearray(4096))
    a.write(b.address, buf, reg.address)
    print("tcp ok")
"""
    env = dict(os.environ, OTE_IBVERBS_LIBRARY="/nonexistent/libibverbs.so.1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused OTE_ERR_UNSUPPORTED" in r.stdout, r.stdout + r.stderr
    assert "tcp ok" in r.stdout, r.stdout + r.stderr
    assert "cannot load /nonexistent/libibverbs.so.1" in r.stderr, r.stderr
