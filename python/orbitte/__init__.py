"""orbitte: Python binding of the OrbitTE transfer engine (ctypes over liborbitte.so).

    import numpy as np, orbitte
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as eng:
        buf = np.zeros(1 << 20, np.uint8)
        eng.register(buf)                                  # peers may READ/WRITE it
        eng.write("10.0.0.2:7000", buf, remote_addr)       # WRITE and wait
        eng.read("10.0.0.2:7000", buf, remote_addr)        # READ and wait

Failures raise OrbitteError subclasses carrying the status name (orbitte.errors). The
library is found through ORBITTE_LIBRARY, else this package's directory, else the source
tree's bazel-bin (orbitte._lib); scripts/python.sh builds it and prints the environment.
"""

from . import _lib, engine as _engine
from .errors import *  # noqa: F401,F403 - the exception classes
from .errors import ERROR_CLASSES, OrbitteError, error_class  # noqa: F401

from ._version import __version__  # noqa: F401

_engine.lib = _lib.load()
library_path = _engine.lib.orbitte_path

# OTE_FEATURE_* of <ote/ote.h>, by name.
_FEATURES = {"rdma_core": 1 << 0, "verbs_sim": 1 << 1, "cuda": 1 << 2, "auth": 1 << 3}


def library_version():
    """The loaded liborbitte.so's version, "MAJOR.MINOR.PATCH" (ote_version)."""
    return _engine.lib.ote_version().decode()


def features():
    """What the library can use on this machine now (ote_features), a set out of
    "rdma_core" (libibverbs loads), "verbs_sim", "cuda" (a CUDA driver library loads) and
    "auth". A name says the library is there, not that a NIC or GPU is."""
    import ctypes

    bits = ctypes.c_uint32(0)
    _engine.check(_engine.lib.ote_features(ctypes.byref(bits)), "ote_features")
    return {name for name, bit in _FEATURES.items() if bits.value & bit}

from .engine import (  # noqa: E402
    MEM_HOST,
    NOTIFY_MAX,
    PERM_IPC,
    PERM_READ,
    PERM_RW,
    PERM_WRITE,
    READ,
    STATES,
    WRITE,
    Batch,
    metadata_buffers,
    metadata_name,
    BufferInfo,
    Engine,
    Notification,
    Registration,
    Segment,
    SharedMemory,
    TransferStatus,
    status_name,
)

# The library's log lines into Python's logging (orbitte.logs).
from .logs import (  # noqa: E402,F401
    TRACE_LEVEL,
    library_log_level,
    route_logs_to_python,
    stop_routing_logs,
)
