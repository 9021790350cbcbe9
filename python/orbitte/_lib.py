"""Finding and loading liborbitte.so, and the ctypes prototypes of the public C API.

The library is looked for, in order:
  1. the path in the environment variable ORBITTE_LIBRARY (an error if it does not exist);
  2. liborbitte.so in this package's directory (where scripts/python.sh or an install
     step puts it);
  3. bazel-bin/engine/liborbitte.so of the source tree this package sits in
     (python/orbitte -> ../../bazel-bin), as built by `bazel build //engine:liborbitte.so`.
Nothing is compiled at import or install time.
"""

import ctypes
import os

LIBRARY_NAME = "liborbitte.so"
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_DIR = os.path.dirname(os.path.dirname(_PKG_DIR))


def candidate_paths():
    """The places searched for the library, in order, as (how, path) pairs."""
    env = os.environ.get("ORBITTE_LIBRARY")
    if env:
        return [("ORBITTE_LIBRARY", env)]
    return [
        ("package directory", os.path.join(_PKG_DIR, LIBRARY_NAME)),
        ("bazel-bin", os.path.join(_REPO_DIR, "bazel-bin", "engine", LIBRARY_NAME)),
    ]


def find_library():
    """The path of liborbitte.so; ImportError naming every place looked at if none."""
    tried = []
    for how, path in candidate_paths():
        if os.path.isfile(path):
            return path
        tried.append("%s: %s" % (how, path))
    raise ImportError(
        "orbitte: liborbitte.so not found (looked at %s). Build it with scripts/python.sh "
        "(or `bazel build //engine:liborbitte.so`) or set ORBITTE_LIBRARY to its path."
        % "; ".join(tried)
    )


status_t = ctypes.c_int32
c_void_p = ctypes.c_void_p
c_size_t = ctypes.c_size_t


class Request(ctypes.Structure):
    """ote_request_t"""

    _fields_ = [
        ("opcode", ctypes.c_int),
        ("local_addr", c_void_p),
        ("segment", c_void_p),
        ("remote_addr", ctypes.c_uint64),
        ("length", c_size_t),
    ]


class SegmentInfo(ctypes.Structure):
    """ote_segment_info_t"""

    _fields_ = [
        ("transport", ctypes.c_char * 16),
        ("peer", ctypes.c_char * 272),
    ]


class BufferInfo(ctypes.Structure):
    """ote_buffer_info_t"""

    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("addr", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("perms", ctypes.c_uint),
        ("kind", ctypes.c_uint32),
        ("numa_node", ctypes.c_int32),
    ]


class NicStats(ctypes.Structure):
    """ote_nic_stats_t"""

    _fields_ = [
        ("transport", ctypes.c_char * 8),
        ("name", ctypes.c_char * 64),
        ("bytes_out", ctypes.c_uint64),
        ("bytes_served", ctypes.c_uint64),
        ("active", ctypes.c_int),
        ("grants", ctypes.c_uint64),
    ]


class TransferStatus(ctypes.Structure):
    """ote_transfer_status_t"""

    _fields_ = [
        ("state", ctypes.c_int),
        ("bytes_done", ctypes.c_uint64),
        ("error", status_t),
    ]


class Notification(ctypes.Structure):
    """ote_notification_t"""

    _fields_ = [
        ("sender", ctypes.c_char * 272),
        ("offset", c_size_t),
        ("len", c_size_t),
        ("name", ctypes.c_char * 64),  # OTE_ENGINE_NAME_MAX + 1
    ]


# ---- statistics (ote_engine_stats, ote_segment_stats, ote_batch_status_ex) ----
STATS_TRANSPORTS = 4  # OTE_STATS_TRANSPORTS
STATS_LATENCY_BUCKETS = 32  # OTE_STATS_LATENCY_BUCKETS
STATS_MEM_KINDS = 3  # OTE_STATS_MEM_KINDS


class RequestStats(ctypes.Structure):
    """ote_request_stats_t"""

    _fields_ = [
        ("submitted", ctypes.c_uint64 * 2),
        ("completed", ctypes.c_uint64 * 2),
        ("failed", ctypes.c_uint64 * 2),
        ("canceled", ctypes.c_uint64 * 2),
        ("timed_out", ctypes.c_uint64 * 2),
        ("bytes", ctypes.c_uint64 * 2),
        ("inflight_requests_now", ctypes.c_uint64),
        ("inflight_bytes_now", ctypes.c_uint64),
        ("latency_ns_sum", ctypes.c_uint64),
        ("latency_us", ctypes.c_uint64 * STATS_LATENCY_BUCKETS),
    ]


class TransportStats(ctypes.Structure):
    """ote_transport_stats_t"""

    _fields_ = [
        ("name", ctypes.c_char * 8),
        ("enabled", ctypes.c_uint32),
        ("peers_now", ctypes.c_uint64),
        ("requests", RequestStats),
    ]


class EngineStats(ctypes.Structure):
    """ote_engine_stats_t"""

    _fields_ = [
        ("struct_size", c_size_t),
        ("transport", TransportStats * STATS_TRANSPORTS),
        ("registrations_now", ctypes.c_uint64),
        ("registered_bytes_now", ctypes.c_uint64),
        ("registrations_kind_now", ctypes.c_uint64 * STATS_MEM_KINDS),
        ("registered_bytes_kind_now", ctypes.c_uint64 * STATS_MEM_KINDS),
        ("registrations_total", ctypes.c_uint64),
        ("notify_sent", ctypes.c_uint64),
        ("notify_send_failed", ctypes.c_uint64),
        ("notify_received", ctypes.c_uint64),
        ("notify_refused", ctypes.c_uint64),
        ("auth_failures", ctypes.c_uint64),
        ("auth_backoff_refused", ctypes.c_uint64),
        ("auth_open_failures", ctypes.c_uint64),
        ("file_read_bytes_mapped", ctypes.c_uint64),
        ("file_read_bytes_bounced", ctypes.c_uint64),
    ]


class SegmentStats(ctypes.Structure):
    """ote_segment_stats_t"""

    _fields_ = [
        ("struct_size", c_size_t),
        ("transport", ctypes.c_char * 8),
        ("transport_id", ctypes.c_uint32),
        ("peer", ctypes.c_char * 272),
        ("requests", RequestStats),
        ("notify_sent", ctypes.c_uint64),
        ("notify_send_failed", ctypes.c_uint64),
    ]


class TransferStatusEx(ctypes.Structure):
    """ote_transfer_status_ex_t"""

    _fields_ = [
        ("struct_size", c_size_t),
        ("state", ctypes.c_int),
        ("error", status_t),
        ("bytes_done", ctypes.c_uint64),
        ("transport", ctypes.c_uint32),
        ("submit_ns", ctypes.c_uint64),
        ("end_ns", ctypes.c_uint64),
        ("file_io", ctypes.c_uint32),  # OTE_FILE_IO_* (requests to file registrations)
    ]


_STATS_PROTOTYPES = {
    "ote_engine_stats": (status_t, [c_void_p, ctypes.POINTER(EngineStats)]),
    "ote_segment_stats": (status_t, [c_void_p, ctypes.POINTER(SegmentStats)]),
    "ote_batch_status_ex": (status_t, [c_void_p, c_size_t, ctypes.POINTER(TransferStatusEx)]),
}


# ote_segment_close_hook_t (arg, segment, ote_segment_close_event_t): declared for
# completeness; the binding itself sets no hook (orbitte.naming closes through its handle).
SegmentCloseHook = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, ctypes.c_int)
# ote_log_callback_t of <ote/log.h>: (arg, level, component, engine or NULL, message).
LogCallback = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                               ctypes.c_char_p)


# name: (restype, argtypes). Every call that can wait (ote_batch_wait, ote_notify_recv)
# takes a deadline in C; ctypes.CDLL releases the GIL for the length of each call.
_PROTOTYPES = {
    "ote_version": (ctypes.c_char_p, []),
    "ote_features": (status_t, [ctypes.POINTER(ctypes.c_uint32)]),
    "ote_config_create": (status_t, [ctypes.POINTER(c_void_p)]),
    "ote_config_set": (status_t, [c_void_p, ctypes.c_char_p, ctypes.c_char_p]),
    "ote_config_get": (status_t, [c_void_p, ctypes.c_char_p, ctypes.c_char_p, c_size_t]),
    "ote_config_destroy": (None, [c_void_p]),
    "ote_engine_create": (status_t, [c_void_p, ctypes.POINTER(c_void_p)]),
    "ote_engine_destroy": (status_t, [c_void_p]),
    "ote_engine_address": (status_t, [c_void_p, ctypes.c_char_p, c_size_t]),
    "ote_engine_nic_stats": (
        status_t,
        [c_void_p, ctypes.POINTER(NicStats), c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_engine_gpu_stats": (status_t, [c_void_p, c_void_p]),
    "ote_engine_topology": (
        status_t,
        [c_void_p, ctypes.c_char_p, c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_engine_metadata": (status_t, [c_void_p, c_void_p, c_size_t, ctypes.POINTER(c_size_t)]),
    "ote_engine_metadata_name": (status_t, [c_void_p, c_size_t, ctypes.c_char_p, c_size_t]),
    "ote_engine_metadata_buffers": (
        status_t,
        [ctypes.c_char_p, c_size_t, ctypes.POINTER(BufferInfo), c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_engine_metadata_peer": (
        status_t,
        [ctypes.c_char_p, c_size_t, ctypes.c_char_p, c_size_t, ctypes.POINTER(ctypes.c_uint64)],
    ),
    "ote_segment_open_md": (
        status_t,
        [c_void_p, ctypes.c_char_p, c_size_t, ctypes.POINTER(c_void_p)],
    ),
    "ote_memory_register": (status_t, [c_void_p, c_void_p, c_size_t, ctypes.c_uint]),
    "ote_memory_register_named": (
        status_t,
        [c_void_p, c_void_p, c_size_t, ctypes.c_uint, ctypes.c_char_p],
    ),
    "ote_memory_unregister": (status_t, [c_void_p, c_void_p]),
    "ote_memory_query": (status_t, [c_void_p, c_void_p, ctypes.POINTER(BufferInfo)]),
    "ote_memory_alloc_shared": (status_t, [c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "ote_memory_free_shared": (status_t, [c_void_p, c_void_p]),
    "ote_file_register": (
        status_t,
        [c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint,
         ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)],
    ),
    "ote_file_unregister": (status_t, [c_void_p, ctypes.c_uint64]),
    "ote_file_query": (status_t, [c_void_p, ctypes.c_uint64, ctypes.POINTER(BufferInfo)]),
    "ote_file_engine": (status_t, [c_void_p, ctypes.c_char_p, c_size_t]),
    "ote_segment_open_local": (status_t, [c_void_p, ctypes.POINTER(c_void_p)]),
    "ote_segment_open": (status_t, [c_void_p, ctypes.c_char_p, ctypes.POINTER(c_void_p)]),
    "ote_segment_close": (status_t, [c_void_p]),
    "ote_segment_invalidate": (status_t, [c_void_p]),
    "ote_segment_set_close_hook": (status_t, [c_void_p, SegmentCloseHook, c_void_p]),
    "ote_segment_info": (status_t, [c_void_p, ctypes.POINTER(SegmentInfo)]),
    "ote_segment_buffers": (
        status_t,
        [c_void_p, ctypes.POINTER(BufferInfo), c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_batch_create": (status_t, [c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "ote_batch_submit": (status_t, [c_void_p, ctypes.POINTER(Request), c_size_t]),
    "ote_batch_submit_v": (
        status_t,
        [c_void_p, ctypes.c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t],
    ),
    "ote_batch_status": (status_t, [c_void_p, c_size_t, ctypes.POINTER(TransferStatus)]),
    "ote_batch_wait": (status_t, [c_void_p, ctypes.c_uint64]),
    "ote_batch_cancel": (status_t, [c_void_p]),
    "ote_batch_reset": (status_t, [c_void_p]),
    "ote_batch_destroy": (status_t, [c_void_p]),
    "ote_batch_notify": (status_t, [c_void_p, c_void_p, ctypes.c_char_p, c_size_t]),
    "ote_batch_notify_result": (status_t, [c_void_p, ctypes.POINTER(status_t)]),
    "ote_notify_send": (status_t, [c_void_p, c_void_p, ctypes.c_char_p, c_size_t]),
    "ote_notify_recv": (
        status_t,
        [
            c_void_p,
            c_void_p,
            c_size_t,
            ctypes.POINTER(c_size_t),
            ctypes.c_char_p,
            c_size_t,
            ctypes.c_uint64,
        ],
    ),
    "ote_notify_recv_ex": (
        status_t,
        [
            c_void_p,
            c_void_p,
            c_size_t,
            ctypes.POINTER(c_size_t),
            ctypes.c_char_p,
            c_size_t,
            ctypes.c_char_p,
            c_size_t,
            ctypes.c_uint64,
        ],
    ),
    "ote_notify_discard": (status_t, [c_void_p, ctypes.POINTER(c_size_t)]),
    "ote_notify_drain": (
        status_t,
        [c_void_p, ctypes.POINTER(Notification), c_size_t, c_void_p, c_size_t,
         ctypes.POINTER(c_size_t)],
    ),
    "ote_status_str": (ctypes.c_char_p, [status_t]),
    "ote_status_describe": (ctypes.c_char_p, [status_t, ctypes.c_char_p, c_size_t]),
    "ote_status_scope": (ctypes.c_int, [status_t]),
    # <ote/log.h> (orbitte.logs): the process-wide callback and level
    "ote_log_set_callback": (status_t, [LogCallback, c_void_p]),
    "ote_log_set_level": (None, [ctypes.c_int]),
    "ote_log_level": (ctypes.c_int, []),
}

_PROTOTYPES.update(_STATS_PROTOTYPES)

PUBLIC_FUNCTIONS = tuple(sorted(_PROTOTYPES))


def load(path=None):
    """Load liborbitte.so (from `path`, else find_library()) and set the prototypes."""
    path = path or find_library()
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    lib.orbitte_path = path
    return lib


# ---- the Python buffer protocol through the C API (keeps the export while registered) ----
class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer (stable layout since Python 3.3)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", c_void_p),
        ("strides", c_void_p),
        ("suboffsets", c_void_p),
        ("internal", c_void_p),
    ]


_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 0x0001
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class BufferView:
    """A held export of a contiguous buffer-protocol object: its address and length stay
    valid (a bytearray cannot be resized, for example) until release()."""

    def __init__(self, obj, writable):
        self._view = _PyBuffer()
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        # PyBUF_SIMPLE/WRITABLE ask for one contiguous run of bytes: a strided numpy view
        # raises BufferError here, a read-only object asked to be writable too.
        self._held = False
        try:
            _get_buffer(obj, ctypes.byref(self._view), flags)
        except ValueError as e:  # numpy says "ndarray is not C-contiguous" as a ValueError
            raise BufferError(str(e)) from e
        self.address = self._view.buf or 0
        self.length = self._view.len
        self._held = True

    def release(self):
        if self._held:
            self._held = False
            _release_buffer(ctypes.byref(self._view))

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass
