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

_engine.lib = _lib.load()
library_path = _engine.lib.orbitte_path

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
    BufferInfo,
    Engine,
    Notification,
    Registration,
    Segment,
    SharedMemory,
    TransferStatus,
    status_name,
)
