"""orbitte.naming: engines published, resolved, listed and opened by name in etcd or Redis
(<ote/naming.h>, ctypes over liborbitte_naming.so, which uses the liborbitte.so already
loaded by orbitte).

    import orbitte, orbitte.naming
    eng = orbitte.Engine({"listen_address": "10.0.0.2:0"})
    names = orbitte.naming.Naming("etcd://10.0.0.5:2379")     # or "redis://host:port"
    names.publish("decode-3", eng)                             # kept alive by a lease
    seg = names.open_segment(eng, "decode-3")                  # anywhere else

liborbitte_naming.so is found through ORBITTE_NAMING_LIBRARY, else this package's
directory, else the source tree's bazel-bin/naming (`bazel build //naming:liborbitte_naming.so`).
"""

import ctypes
import os
import threading
from ctypes import c_char_p, c_size_t, c_uint32, c_uint64, c_void_p

from . import engine as _engine
from .engine import Segment, check

LIBRARY_NAME = "liborbitte_naming.so"
NAME_MAX = 200
UP, CHANGED, GONE = 1, 2, 3


class _Opts(ctypes.Structure):
    _fields_ = [
        ("timeout_ms", c_uint32),
        ("ttl_ms", c_uint32),
        ("cache_ms", c_uint32),
        ("watch_period_ms", c_uint32),
        ("prefix", c_char_p),
    ]


class Entry(ctypes.Structure):
    """What a name resolves to: addr ("host:port", bytes) and epoch (its incarnation)."""

    _fields_ = [("addr", ctypes.c_char * 272), ("epoch", c_uint64)]


_WATCH_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, ctypes.c_int, ctypes.POINTER(Entry))
_status = ctypes.c_uint32
_PROTOTYPES = {
    "ote_naming_open": (_status, [c_char_p, ctypes.POINTER(_Opts), ctypes.POINTER(c_void_p)]),
    "ote_naming_close": (_status, [c_void_p]),
    "ote_naming_publish": (_status, [c_void_p, c_char_p, c_void_p]),
    "ote_naming_unpublish": (_status, [c_void_p, c_char_p]),
    "ote_naming_resolve": (
        _status,
        [c_void_p, c_char_p, ctypes.POINTER(Entry), c_void_p, c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_naming_list": (
        _status,
        [c_void_p, c_char_p, c_void_p, c_size_t, ctypes.POINTER(c_size_t)],
    ),
    "ote_naming_watch": (
        _status,
        [c_void_p, c_char_p, _WATCH_FN, c_void_p, ctypes.POINTER(c_void_p)],
    ),
    "ote_naming_unwatch": (_status, [c_void_p]),
    "ote_naming_segment_open": (_status, [c_void_p, c_void_p, c_char_p, ctypes.POINTER(c_void_p)]),
    "ote_naming_segment_close": (_status, [c_void_p, c_void_p]),
}

_lib = None
_lib_lock = threading.Lock()


def find_library():
    """The path of liborbitte_naming.so; ImportError naming every place looked at if none."""
    env = os.environ.get("ORBITTE_NAMING_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise ImportError("orbitte.naming: ORBITTE_NAMING_LIBRARY=%s does not exist" % env)
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    places = [os.path.join(here, LIBRARY_NAME),
              os.path.join(here, "..", "..", "bazel-bin", "naming", LIBRARY_NAME)]
    for p in places:
        if os.path.exists(p):
            return os.path.normpath(p)
    raise ImportError("orbitte.naming: %s not found (looked at %s); build it with "
                      "`bazel build //naming:liborbitte_naming.so` or set "
                      "ORBITTE_NAMING_LIBRARY" % (LIBRARY_NAME, ", ".join(places)))


def _load():
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(find_library())
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            _lib = lib
    return _lib


class Naming:
    """A handle on a store: Naming("etcd://h:p[,h:p...]" | "redis://h:p", timeout_ms=2000,
    ttl_ms=10000, cache_ms=0, watch_period_ms=200, prefix="orbitte/")."""

    def __init__(self, url, timeout_ms=0, ttl_ms=0, cache_ms=0, watch_period_ms=0, prefix=None):
        self._lib = _load()
        self._close_lock = threading.Lock()  # close() and the guarded segments' closes
        self._prefix = prefix.encode() if prefix else None  # kept alive with the handle
        opts = _Opts(timeout_ms, ttl_ms, cache_ms, watch_period_ms, self._prefix)
        handle = c_void_p()
        check(self._lib.ote_naming_open(url.encode(), ctypes.byref(opts), ctypes.byref(handle)),
              "ote_naming_open(%s)" % url)
        self._handle, self.url, self._watches = handle.value, url, {}

    @property
    def handle(self):
        if not self._handle:
            raise _engine._state_error("the Naming handle is closed")
        return self._handle

    def publish(self, name, engine):
        check(self._lib.ote_naming_publish(self.handle, name.encode(), engine.handle),
              "ote_naming_publish(%s)" % name)

    def unpublish(self, name):
        check(self._lib.ote_naming_unpublish(self.handle, name.encode()),
              "ote_naming_unpublish(%s)" % name)

    def resolve(self, name):
        """(addr, epoch) of the engine published under name (NotFoundError if none)."""
        e = Entry()
        check(self._lib.ote_naming_resolve(self.handle, name.encode(), ctypes.byref(e), None, 0,
                                           None), "ote_naming_resolve(%s)" % name)
        return e.addr.decode(), e.epoch

    def metadata(self, name):
        """The metadata blob published under name (bytes, for Engine.open_segment_md)."""
        n = c_size_t()
        st = self._lib.ote_naming_resolve(self.handle, name.encode(), None, None, 0, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(n.value, 1))
        if st != 0:  # TOO_BIG with the size, else the error
            st = self._lib.ote_naming_resolve(self.handle, name.encode(), None, buf, len(buf),
                                              ctypes.byref(n))
        check(st, "ote_naming_resolve(%s)" % name)
        return buf.raw[:n.value]

    def list(self, prefix=""):
        """The live names under prefix, sorted."""
        cap = 64
        while True:
            arr = ctypes.create_string_buffer(cap * (NAME_MAX + 1))
            n = c_size_t()
            st = self._lib.ote_naming_list(self.handle, prefix.encode(), arr, cap, ctypes.byref(n))
            if st & 0xFFFF == 11:  # OTE_ERR_TOO_BIG: n names the size needed
                cap = n.value + 16
                continue
            check(st, "ote_naming_list(%s)" % prefix)
            raw = arr.raw
            return [raw[i * (NAME_MAX + 1):(i + 1) * (NAME_MAX + 1)].split(b"\0", 1)[0].decode()
                    for i in range(n.value)]

    def open_segment(self, engine, name):
        """A Segment to the engine published under name (orbitte.Segment). It fails fast:
        while it is open (and this handle too) its name is watched, and when the name ends
        (the publisher died, hangs or withdrew it) or names another incarnation, its
        requests end PeerLostError at once instead of at their deadlines. Its close()
        stops the watching."""
        handle = c_void_p()
        check(self._lib.ote_naming_segment_open(self.handle, engine.handle, name.encode(),
                                                ctypes.byref(handle)),
              "ote_naming_segment_open(%s)" % name)
        seg = Segment(engine, name, handle.value, closer=self._segment_closer)
        with engine._lock:
            engine._segments.add(seg)
        return seg

    def _segment_closer(self, seg_handle):
        # Through this handle while it is open (the guard goes with the segment); after
        # close() the segment is no longer guarded and closes as any other.
        with self._close_lock:
            if self._handle:
                return self._lib.ote_naming_segment_close(self._handle, seg_handle)
        return _engine.lib.ote_segment_close(seg_handle)

    def watch(self, name, fn):
        """Call fn(name, event, (addr, epoch) or None) from the handle's thread on each change
        (UP, CHANGED, GONE); returns a token for unwatch(). fn must not call this handle."""
        def trampoline(_arg, cname, ev, entry):
            try:
                e = (entry.contents.addr.decode(), entry.contents.epoch) if entry else None
                fn(cname.decode(), ev, e)
            except Exception:  # noqa: BLE001 - never raise into C
                pass
        cb = _WATCH_FN(trampoline)
        w = c_void_p()
        check(self._lib.ote_naming_watch(self.handle, name.encode(), cb, None, ctypes.byref(w)),
              "ote_naming_watch(%s)" % name)
        self._watches[w.value] = cb  # the callback lives as long as the watch
        return w.value

    def unwatch(self, token):
        check(self._lib.ote_naming_unwatch(token), "ote_naming_unwatch")
        self._watches.pop(token, None)

    def close(self):
        with self._close_lock:
            if self._handle:
                check(self._lib.ote_naming_close(self._handle), "ote_naming_close")
                self._handle = None
                self._watches.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
