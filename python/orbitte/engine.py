"""Engine, registrations, segments and batches over liborbitte.so (see __init__.py)."""

import collections
import ctypes
import numbers
import threading
import time

from . import _lib
from . import stats as _stats
from .errors import error_class

try:  # optional: submit_arrays converts numpy arrays without a Python loop
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is in the test environment
    _np = None

READ = 0  # remote -> local (OTE_READ)
WRITE = 1  # local -> remote (OTE_WRITE)
PERM_READ = 0x1  # peers may READ from the registration
PERM_WRITE = 0x2  # peers may WRITE into it
PERM_RW = PERM_READ | PERM_WRITE
PERM_IPC = 0x4  # OTE_PERM_IPC: opts a device registration in to CUDA IPC (never alone)
NOTIFY_MAX = 4096  # OTE_NOTIFY_MAX
STATES = ("WAITING", "PENDING", "COMPLETED", "FAILED", "CANCELED", "TIMEOUT")
MEM_HOST = 0  # OTE_MEM_HOST: the kind of host (CPU) memory
MEM_HOST_PINNED = 1  # OTE_MEM_HOST_PINNED: host memory pinned by the CUDA driver
MEM_CUDA = 16  # OTE_MEM_CUDA: device memory of CUDA device 0 (MEM_CUDA + n: device n)
_OTE_ERR_STATE = 13
_OTE_ERR_TIMEOUT = 8
_OTE_ERR_TOO_BIG = 11

# One of a peer's registrations as Segment.buffers() lists it: name ("" when registered
# without one), address (the peer's: a remote_addr), length, perms (PERM_*), kind
# (MEM_HOST).
BufferInfo = collections.namedtuple("BufferInfo", "name address length perms kind")
_WAIT_SLICE_S = 0.5  # longest single C wait, so Ctrl-C is seen between two of them
_CLOSE_WAIT_S = 60.0  # how long close() waits for canceled requests to end

lib = None  # set by orbitte/__init__.py once the library is loaded


def describe(status):
    buf = ctypes.create_string_buffer(256)
    return lib.ote_status_describe(status, buf, len(buf)).decode(errors="replace")


def status_name(status):
    return lib.ote_status_str(status).decode()


def check(status, what):
    """Raise the exception of a failed status; `what` says which call failed."""
    if status != 0:
        raise error_class(status)(status, what, describe(status))


def _state_error(what):
    return error_class(_OTE_ERR_STATE)(_OTE_ERR_STATE, what, "OTE_ERR_STATE: " + what)


def _ns(seconds):
    return max(0, int(seconds * 1e9))


def _config_str(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _resolve(obj, length, writable):
    """(address, length, holder) of a local buffer: a buffer-protocol object (held by a
    BufferView until released), an object with data_ptr() (a torch tensor; the caller
    keeps it referenced) or a raw integer address (length required)."""
    if isinstance(obj, numbers.Integral):  # int, numpy integers
        if length is None:
            raise ValueError("a raw address needs a length")
        return int(obj), int(length), None
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "numel"):
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("the tensor is not contiguous (a view with strides): its bytes "
                             "are not one run; register the tensor it views, or .contiguous()")
        n = obj.numel() * obj.element_size()
        if length is not None and length > n:
            raise ValueError("length %d is over the tensor's %d bytes" % (length, n))
        return obj.data_ptr(), n if length is None else int(length), None
    view = _lib.BufferView(obj, writable)
    if length is not None and length > view.length:
        view.release()
        raise ValueError("length %d is over the buffer's %d bytes" % (length, view.length))
    return view.address, view.length if length is None else int(length), view


def _u64_array(values):
    """(address, keeper) of a contiguous uint64 array holding `values`: a numpy array as
    it is when it already is one, converted by numpy otherwise; other sequences through
    ctypes (a C loop). The keeper holds the memory until the call returns."""
    if _np is not None and isinstance(values, _np.ndarray):
        arr = _np.ascontiguousarray(values, dtype=_np.uint64)
        return arr.ctypes.data, arr
    arr = (ctypes.c_uint64 * len(values))(*values)
    return ctypes.addressof(arr), arr


def metadata_buffers(blob):
    """The registrations a metadata blob (Engine.metadata()) carries, as BufferInfo in
    address order, read from the blob alone (ote_engine_metadata_buffers)."""
    blob = bytes(blob)
    cap = 16
    for _ in range(2):
        arr = (_lib.BufferInfo * cap)()
        n = ctypes.c_size_t()
        st = lib.ote_engine_metadata_buffers(blob, len(blob), arr, cap, ctypes.byref(n))
        if st == _OTE_ERR_TOO_BIG:
            cap = n.value
            continue
        check(st, "ote_engine_metadata_buffers")
        return [BufferInfo(b.name.decode("ascii"), b.addr, b.length, b.perms, b.kind)
                for b in arr[:n.value]]
    check(_OTE_ERR_TOO_BIG, "ote_engine_metadata_buffers")


def metadata_name(blob):
    """The engine name (its engine_name) a metadata blob carries, "" for an unnamed
    engine's (ote_engine_metadata_name)."""
    blob = bytes(blob)
    name = ctypes.create_string_buffer(64)
    check(lib.ote_engine_metadata_name(blob, len(blob), name, len(name)),
          "ote_engine_metadata_name")
    return name.value.decode("ascii")


def _md_address(blob):
    """The "host:port" a (decoded, valid) metadata blob names: its header says where."""
    n = int.from_bytes(blob[6:8], "little")
    return blob[20:20 + n].decode("ascii")


NicStats = collections.namedtuple("NicStats", "transport name bytes_out bytes_served active grants")


class TransferStatus(collections.namedtuple("TransferStatus", "state bytes_done error")):
    """One request of a batch: state is one of STATES, error is None or the exception (not
    raised) of a FAILED/CANCELED/TIMEOUT request. Also (ote_batch_status_ex; not part of
    the tuple): transport ("shm", "tcp", "rdma"; None for a WAITING slot), submit_ns and
    end_ns (CLOCK_MONOTONIC nanoseconds; 0 until reached) and latency (seconds from submit
    to end, None while pending)."""

    transport = None
    submit_ns = 0
    end_ns = 0

    @property
    def latency(self):
        return (self.end_ns - self.submit_ns) / 1e9 if self.end_ns else None


# name: the sender's engine name (its engine_name config key), "" when it has none.
Notification = collections.namedtuple("Notification", "message sender name", defaults=("",))


class Registration:
    """Registered memory: [address, address + length) reachable by peers with `perms`.
    The registered object stays referenced (and a buffer stays exported, so a bytearray
    cannot be resized) until unregister()."""

    def __init__(self, engine, address, length, perms, name, obj, view):
        self.engine, self.address, self.length = engine, address, length
        self.perms, self.name, self.obj = perms, name, obj
        self._view = view

    def unregister(self):
        self.engine.unregister(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.engine._registrations.get(self.address) is self:
            self.unregister()

    def __repr__(self):
        return "Registration(address=0x%x, length=%d, perms=%d, name=%r)" % (
            self.address, self.length, self.perms, self.name)


class SharedMemory:
    """Host memory from ote_memory_alloc_shared (Engine.alloc_shared): a same-host peer
    maps it, so that requests over shm whose local buffer lies in it are copied by the
    peer with one memcpy instead of a cross-memory-attach call (docs/performance.md "Same host").
    `view` is a writable memoryview of its `length` bytes (zeroed at first), usable as
    any local buffer (numpy.frombuffer(shm.view, numpy.uint8) too) and registrable. Free
    it with free() (or leave the `with` block) once no request uses it and it is
    unregistered. free() releases `view` (refused with BufferError while an object still
    holds a buffer of it, a Registration of the view for one), but numpy arrays and
    slices made from the view are not tracked: drop them first, the memory is unmapped."""

    def __init__(self, engine, address, length):
        self.engine, self.address, self.length = engine, address, length
        self._array = (ctypes.c_ubyte * length).from_address(address)
        self.view = memoryview(self._array).cast("B")

    def free(self):
        self.engine.free_shared(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.engine._shared.get(self.address) is self:
            self.free()

    def __repr__(self):
        return "SharedMemory(address=0x%x, length=%d)" % (self.address, self.length)


class Segment:
    """An open connection to a peer engine ("host:port")."""

    def __init__(self, engine, peer, handle, closer=None):
        self.engine, self.peer, self._handle = engine, peer, handle
        # closer(handle) -> status closes the handle (default ote_segment_close); a segment
        # opened by name closes through its naming handle (orbitte.naming).
        self._closer = closer if closer is not None else lib.ote_segment_close
        # Held by calls on the handle and by close(): never the engine's lock, so a call
        # that waits on this peer (buffer discovery) holds up no other peer's threads.
        self._lock = threading.RLock()

    @property
    def handle(self):
        if not self._handle:
            raise _state_error("segment %s is closed" % self.peer)
        return self._handle

    @property
    def transport(self):
        """The transport ote_segment_open chose for this peer: "shm", "tcp" or "rdma"."""
        info = _lib.SegmentInfo()
        with self._lock:
            check(lib.ote_segment_info(self.handle, ctypes.byref(info)), "ote_segment_info")
        return info.transport.decode()

    def stats(self):
        """This segment's counters since it was opened: orbitte.stats.SegmentStats
        (ote_segment_stats)."""
        with self._lock:
            return _stats.segment_stats(lib, self.handle, check)

    def buffers(self):
        """The peer's registrations now, as a list of BufferInfo sorted by address (each
        call asks the peer again: ote_segment_buffers)."""
        cap = 16
        for _ in range(8):  # the list may grow between two calls; retry a few times
            arr = (_lib.BufferInfo * cap)()
            n = ctypes.c_size_t()
            with self._lock:
                st = lib.ote_segment_buffers(self.handle, arr, cap, ctypes.byref(n))
            if st == _OTE_ERR_TOO_BIG and n.value > cap:
                cap = n.value + 16
                continue
            check(st, "ote_segment_buffers(%s)" % self.peer)
            return [BufferInfo(b.name.decode("ascii"), b.addr, b.length, b.perms, b.kind)
                    for b in arr[:n.value]]
        check(_OTE_ERR_TOO_BIG, "ote_segment_buffers(%s): the list kept growing" % self.peer)

    def buffer(self, name):
        """The peer's registration called `name` (a BufferInfo), asked now; KeyError if
        the peer has none by that name."""
        for b in self.buffers():
            if name and b.name == name:
                return b
        raise KeyError("peer %s has no registration named %r" % (self.peer, name))

    def close(self):
        with self._lock:
            if not self._handle:
                return
            check(self._closer(self._handle), "ote_segment_close(%s)" % self.peer)
            self._handle = None
        with self.engine._lock:
            self.engine._segments.discard(self)
            if self.engine._sessions.get(self.peer) is self:
                del self.engine._sessions[self.peer]

    def invalidate(self):
        """Declare the peer gone (ote_segment_invalidate): requests in flight or queued on
        this segment end OTE_ERR_PEER_LOST now, and later ones fail PeerLostError at once.
        For good: close it and open a new one."""
        with self._lock:
            check(lib.ote_segment_invalidate(self.handle), "ote_segment_invalidate(%s)" % self.peer)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "Segment(%r%s)" % (self.peer, "" if self._handle else ", closed")


class Batch:
    """Up to `capacity` READ/WRITE requests submitted, waited for, polled and canceled
    together. Local buffers are held from submit until reset() or close()."""

    def __init__(self, engine, capacity):
        self.engine, self.capacity = engine, capacity
        self._lock = threading.Lock()
        self._held = []  # BufferViews and objects of the submitted requests
        self._count = 0
        handle = ctypes.c_void_p()
        check(lib.ote_batch_create(engine.handle, capacity, ctypes.byref(handle)), "ote_batch_create")
        self._handle = handle.value

    @property
    def handle(self):
        if not self._handle:
            raise _state_error("batch is closed")
        return self._handle

    def __len__(self):
        return self._count

    def submit(self, requests):
        """Submit (opcode, local, segment, remote_addr[, length]) tuples: opcode READ or
        WRITE, local a buffer (numpy array, bytearray, memoryview, ...) or an address,
        segment a Segment or "host:port", length default the local buffer's. All are
        validated first, then started; returns the requests' indices in the batch."""
        requests = list(requests)
        arr = (_lib.Request * max(1, len(requests)))()
        held = []
        try:
            for i, req in enumerate(requests):
                opcode, local, seg, remote = req[:4]
                length = req[4] if len(req) > 4 else None
                if opcode not in (READ, WRITE):
                    raise ValueError("opcode must be orbitte.READ or orbitte.WRITE")
                addr, n, view = _resolve(local, length, writable=opcode == READ)
                held.append(view if view is not None else local)
                seg = self.engine._segment_of(seg)
                held.append(seg)
                arr[i] = _lib.Request(opcode, addr, seg.handle, int(remote), n)
            with self._lock:
                check(lib.ote_batch_submit(self.handle, arr, len(requests)), "ote_batch_submit")
                first = self._count
                self._count += len(requests)
                self._held.extend(held)
                held = []
            return list(range(first, first + len(requests)))
        finally:
            for h in held:
                if isinstance(h, _lib.BufferView):
                    h.release()

    def submit_arrays(self, opcode, segment, local, remote, lengths):
        """Submit len(local) requests of one opcode to one segment (a Segment or
        "host:port") given as arrays: request i moves lengths[i] bytes between the local
        address local[i] and the peer's address remote[i]. Each array is a numpy array
        (converted to uint64 without a Python loop), or any sequence of ints. The caller
        keeps the local memory alive and registered until the requests end. Returns the
        range of the requests' indices (ote_batch_submit_v)."""
        if opcode not in (READ, WRITE):
            raise ValueError("opcode must be orbitte.READ or orbitte.WRITE")
        seg = self.engine._segment_of(segment)
        arrays = [_u64_array(a) for a in (local, remote, lengths)]
        n = len(arrays[0][1])
        if not n == len(arrays[1][1]) == len(arrays[2][1]):
            raise ValueError("local, remote and lengths differ in number (%d, %d, %d)" % (
                n, len(arrays[1][1]), len(arrays[2][1])))
        with self._lock:
            check(lib.ote_batch_submit_v(self.handle, opcode, seg.handle, arrays[0][0],
                                         arrays[1][0], arrays[2][0], n),
                  "ote_batch_submit_v(%d requests)" % n)
            first = self._count
            self._count += n
            self._held.append(seg)
        return range(first, first + n)

    def wait(self, timeout=None):
        """Wait until every submitted request has ended. Raises the first failed request's
        error (the exception's .failed lists the indices of all failed requests), or
        orbitte.TimeoutError_ when `timeout` seconds (None: no limit of its own; every
        transfer still ends by the engine's transfer_timeout_ms) pass with requests still
        pending. The GIL is released during the wait, which runs in C with a deadline."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_SLICE_S if end is None else min(_WAIT_SLICE_S, end - time.monotonic())
            st = lib.ote_batch_wait(self.handle, _ns(left))
            if st == 0:
                return
            if st != _OTE_ERR_TIMEOUT or (end is not None and time.monotonic() >= end):
                break
        exc = error_class(st)(st, "ote_batch_wait", describe(st))
        if st != _OTE_ERR_TIMEOUT:
            exc.failed = [i for i in range(self._count) if self.status(i).state != "COMPLETED"]
        raise exc

    def status(self, index):
        """TransferStatus of the index-th request submitted, with its timing."""
        ts = _lib.TransferStatusEx()
        ts.struct_size = ctypes.sizeof(ts)
        check(lib.ote_batch_status_ex(self.handle, index, ctypes.byref(ts)),
              "ote_batch_status_ex")
        err = None
        if ts.error != 0:
            err = error_class(ts.error)(ts.error, "request %d" % index, describe(ts.error))
        out = TransferStatus(STATES[ts.state], ts.bytes_done, err)
        if ts.state != 0:
            names = _stats.TRANSPORT_NAMES
            out.transport = names[ts.transport] if ts.transport < len(names) else str(ts.transport)
        out.submit_ns, out.end_ns = ts.submit_ns, ts.end_ns
        return out

    def statuses(self):
        return [self.status(i) for i in range(self._count)]

    def cancel(self):
        """Cancel every pending request; returns at once (wait() sees them end)."""
        check(lib.ote_batch_cancel(self.handle), "ote_batch_cancel")

    def notify(self, segment, message):
        """Attach a message for `segment`'s engine, sent once every request of this batch
        to that segment has completed (never before the data is in its memory)."""
        seg = self.engine._segment_of(segment)
        msg = bytes(message)
        check(lib.ote_batch_notify(self.handle, seg.handle, msg, len(msg)), "ote_batch_notify")
        with self._lock:
            self._held.append(seg)

    def notify_result(self):
        """The outcome of this batch's notifications (ote_batch_notify_result): None when
        every one sent was acknowledged, else the exception (not raised) of the first
        failure: CanceledError when one was not sent because a request to its peer did
        not complete, AgainError while one is undecided or in flight, or when its
        receiver's queue stayed full until its deadline. Final once wait() returned."""
        st = _lib.status_t()
        check(lib.ote_batch_notify_result(self.handle, ctypes.byref(st)), "ote_batch_notify_result")
        if st.value == 0:
            return None
        return error_class(st.value)(st.value, "batch notification", describe(st.value))

    def reset(self):
        """Forget the finished requests (BusyError while some are pending)."""
        with self._lock:
            check(lib.ote_batch_reset(self.handle), "ote_batch_reset")
            self._count = 0
            self._release_held()

    def _release_held(self):
        for h in self._held:
            if isinstance(h, _lib.BufferView):
                h.release()
        self._held = []

    def close(self):
        """Cancel what is pending, wait for it to end (bounded) and destroy the batch."""
        if not self._handle:
            return
        st = lib.ote_batch_destroy(self._handle)
        if st != 0 and (st & 0xFFFF) == 6:  # BUSY: requests pending
            lib.ote_batch_cancel(self._handle)
            end = time.monotonic() + _CLOSE_WAIT_S
            while lib.ote_batch_wait(self._handle, _ns(_WAIT_SLICE_S)) == _OTE_ERR_TIMEOUT:
                if time.monotonic() >= end:
                    break
            st = lib.ote_batch_destroy(self._handle)
        check(st, "ote_batch_destroy")
        self._handle = None
        with self._lock:
            self._release_held()
        with self.engine._lock:
            self.engine._batches.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Engine:
    """An OrbitTE engine. `config` maps the keys of <ote/ote.h> (transport,
    listen_address, transfer_timeout_ms, ...) to values (str, int or bool); keys not given
    come from OTE_<KEY> environment variables or the defaults. A context manager: leaving
    it (or close()) closes every batch, segment and registration it made, then the
    engine."""

    def __init__(self, config=None):
        self._lock = threading.RLock()
        self._handle = None
        self._registrations = {}  # address -> Registration
        self._segments = set()
        self._sessions = {}  # "host:port" -> Segment opened for write()/read()/notify_send()
        self._opening = {}  # "host:port" -> Lock held while that session is being opened
        # How a session to a string target is opened: open_segment ("host:port"), or a
        # name service's open by name (orbitte.mooncake with a metadata server).
        self.session_opener = None
        self._batches = set()
        self._shared = {}  # address -> SharedMemory
        cfg = ctypes.c_void_p()
        check(lib.ote_config_create(ctypes.byref(cfg)), "ote_config_create")
        try:
            for key, value in (config or {}).items():
                check(lib.ote_config_set(cfg, str(key).encode(), _config_str(value).encode()),
                      "config %s=%r" % (key, value))
            handle = ctypes.c_void_p()
            check(lib.ote_engine_create(cfg, ctypes.byref(handle)), "ote_engine_create")
        finally:
            lib.ote_config_destroy(cfg)
        self._handle = handle.value

    @property
    def handle(self):
        if not self._handle:
            raise _state_error("engine is closed")
        return self._handle

    @property
    def closed(self):
        return not self._handle

    @property
    def address(self):
        """The "host:port" other engines open this one by."""
        buf = ctypes.create_string_buffer(256)
        check(lib.ote_engine_address(self.handle, buf, len(buf)), "ote_engine_address")
        return buf.value.decode()

    def nic_stats(self):
        """The data devices (NICs) of this engine's transports and the bytes each carried:
        a list of NicStats(transport, name, bytes_out, bytes_served, active, grants: the
        grant round trips this engine asked of peers on it); [] over TCP
        and shm (ote_engine_nic_stats)."""
        cap = 8
        for _ in range(4):
            arr = (_lib.NicStats * cap)()
            n = ctypes.c_size_t()
            st = lib.ote_engine_nic_stats(self.handle, arr, cap, ctypes.byref(n))
            if st == _OTE_ERR_TOO_BIG and n.value > cap:
                cap = n.value
                continue
            check(st, "ote_engine_nic_stats")
            return [NicStats(x.transport.decode("ascii"), x.name.decode("ascii"), x.bytes_out,
                             x.bytes_served, bool(x.active), x.grants) for x in arr[:n.value]]
        check(_OTE_ERR_TOO_BIG, "ote_engine_nic_stats: the list kept growing")

    def stats(self):
        """The engine's counters (closed segments' included): orbitte.stats.EngineStats
        (ote_engine_stats). orbitte.metrics.Collector exports them to Prometheus."""
        return _stats.engine_stats(lib, self.handle, check)

    # ---- memory ----
    def register(self, buffer_or_address, length=None, perms=PERM_RW, name=None):
        """Register memory for peers: a buffer-protocol object (numpy array, bytearray,
        memoryview; one contiguous run, writable when perms has PERM_WRITE), an object
        with data_ptr() (a torch tensor) or a raw address with its length. The object is
        referenced until unregistered. `name` (1..63 printable ASCII characters, unique
        in this engine) is what peers see in Segment.buffers(); None registers without."""
        obj = buffer_or_address
        cname = None if name is None else str(name).encode("utf-8")
        addr, n, view = _resolve(obj, length, writable=bool(perms & PERM_WRITE))
        try:
            # Pinning a big buffer takes a while: no lock of this binding is held meanwhile.
            check(lib.ote_memory_register_named(self.handle, addr, n, perms, cname),
                  "ote_memory_register(0x%x, %d%s)" % (
                      addr, n, "" if name is None else ", name=%r" % name))
            reg = Registration(self, addr, n, perms, name, obj, view)
            with self._lock:
                self._registrations[addr] = reg
            view = None
            return reg
        finally:
            if view is not None:
                view.release()

    def unregister(self, registration_or_address):
        r = registration_or_address
        addr = r.address if isinstance(r, Registration) else int(r)
        check(lib.ote_memory_unregister(self.handle, addr), "ote_memory_unregister(0x%x)" % addr)
        with self._lock:
            reg = self._registrations.pop(addr, None)
        if reg is not None and reg._view is not None:
            reg._view.release()

    def alloc_shared(self, length):
        """`length` bytes of shared host memory (a SharedMemory; ote_memory_alloc_shared)."""
        length = int(length)
        addr = ctypes.c_void_p()
        with self._lock:
            check(lib.ote_memory_alloc_shared(self.handle, length, ctypes.byref(addr)),
                  "ote_memory_alloc_shared(%d)" % length)
            shm = SharedMemory(self, addr.value, length)
            self._shared[addr.value] = shm
        return shm

    def free_shared(self, shm):
        """Free a SharedMemory of this engine (ote_memory_free_shared): BusyError while it is
        registered, BufferError while an object holds a buffer of its view (a
        Registration of the view); in both cases nothing is freed."""
        with self._lock:
            if self._shared.get(shm.address) is not shm:
                raise ValueError("%r is not a live shared allocation of this engine" % (shm,))
            shm.view.release()  # BufferError while exported: nothing freed
            try:
                check(lib.ote_memory_free_shared(self.handle, shm.address),
                      "ote_memory_free_shared(0x%x)" % shm.address)
            except Exception:
                shm.view = memoryview(shm._array).cast("B")  # still allocated
                raise
            del self._shared[shm.address]
            shm._array = None

    @property
    def registrations(self):
        with self._lock:
            return list(self._registrations.values())

    # ---- segments ----
    def open_segment(self, peer):
        """Connect to the engine at "host:port" (or "[v6]:port") and handshake."""
        handle = ctypes.c_void_p()
        # The handshake may wait up to connect_timeout_ms on this peer: no lock held.
        check(lib.ote_segment_open(self.handle, peer.encode(), ctypes.byref(handle)),
              "ote_segment_open(%s)" % peer)
        seg = Segment(self, peer, handle.value)
        with self._lock:
            self._segments.add(seg)
        return seg

    def metadata(self):
        """This engine's metadata blob (bytes: its address, incarnation and registrations;
        ote_engine_metadata), to hand to another process over any side channel."""
        need = ctypes.c_size_t()
        for _ in range(4):  # the registrations may change between two calls
            cap = need.value
            buf = ctypes.create_string_buffer(max(1, cap))
            st = lib.ote_engine_metadata(self.handle, buf if cap else None, cap, ctypes.byref(need))
            if st == _OTE_ERR_TOO_BIG:
                continue
            check(st, "ote_engine_metadata")
            return buf.raw[: need.value]
        check(_OTE_ERR_TOO_BIG, "ote_engine_metadata: the registrations kept changing")

    def open_segment_md(self, blob):
        """A Segment to the engine a metadata blob describes (ote_segment_open_md):
        StateError when the engine at its address is another incarnation now."""
        blob = bytes(blob)
        handle = ctypes.c_void_p()
        check(lib.ote_segment_open_md(self.handle, blob, len(blob), ctypes.byref(handle)),
              "ote_segment_open_md")
        seg = Segment(self, _md_address(blob), handle.value)
        with self._lock:
            self._segments.add(seg)
        return seg

    def session(self, peer):
        """The engine's own segment to "host:port", opened on first use and kept until
        close(); write(), read(), notify_send() and Batch.submit() use it for a string."""
        return self._segment_of(peer)

    def _segment_of(self, target):
        """The session to target, opened once: threads asking for the same peer wait for
        its open; threads of other peers never wait on it (per-peer lock)."""
        if isinstance(target, Segment):
            return target
        with self._lock:
            seg = self._sessions.get(target)
            if seg is not None:
                return seg
            opening = self._opening.setdefault(target, threading.Lock())
        with opening:
            with self._lock:
                seg = self._sessions.get(target)
            if seg is None:
                seg = (self.session_opener or self.open_segment)(target)
                with self._lock:
                    self._sessions[target] = seg
            return seg

    def forget_session(self, target):
        """Close the kept session to "host:port" (if any), so the next use opens a new one
        (after the peer restarted, say). Returns whether one was closed."""
        with self._lock:
            seg = self._sessions.pop(target, None)
        if seg is None:
            return False
        seg.close()
        return True

    # ---- batches and the synchronous conveniences ----
    def batch(self, capacity=64):
        """A new Batch of up to `capacity` requests (a context manager)."""
        with self._lock:
            b = Batch(self, capacity)
            self._batches.add(b)
        return b

    def _transfer(self, opcode, target, local, remote, length, notify, timeout):
        if isinstance(local, (list, tuple)):
            lengths = length if length is not None else [None] * len(local)
            reqs = [(opcode, lo, target, ra, ln) for lo, ra, ln in zip(local, remote, lengths)]
            if not len(local) == len(remote) == len(lengths):
                raise ValueError("buffers, remote addresses and lengths differ in number")
        else:
            reqs = [(opcode, local, target, remote, length)]
        with self.batch(max(1, len(reqs))) as b:
            b.submit(reqs)
            if notify is not None:
                b.notify(target, notify)
            b.wait(timeout)

    def write(self, target, local, remote_addr, length=None, notify=None, timeout=None):
        """WRITE local buffer(s) to the peer's address(es) and wait. `target` is a Segment
        or "host:port"; local, remote_addr and length may be lists (one batch). With
        `notify`, the peer receives that message once all the data is in its memory."""
        self._transfer(WRITE, target, local, remote_addr, length, notify, timeout)

    def read(self, target, local, remote_addr, length=None, notify=None, timeout=None):
        """READ from the peer's address(es) into local buffer(s) and wait (see write)."""
        self._transfer(READ, target, local, remote_addr, length, notify, timeout)

    def transfer_sync_write(self, target, buffer, peer_buffer_address, length):
        """Mooncake's call: returns 0; a failure raises instead of returning -1."""
        self.write(target, buffer, peer_buffer_address, length)
        return 0

    def transfer_sync_read(self, target, buffer, peer_buffer_address, length):
        self.read(target, buffer, peer_buffer_address, length)
        return 0

    def batch_transfer_sync_write(self, target, buffers, peer_buffer_addresses, lengths):
        """Mooncake's call over lists: returns 0; a failure raises."""
        self.write(target, list(buffers), list(peer_buffer_addresses), list(lengths))
        return 0

    def batch_transfer_sync_read(self, target, buffers, peer_buffer_addresses, lengths):
        self.read(target, list(buffers), list(peer_buffer_addresses), list(lengths))
        return 0

    # ---- notifications ----
    def notify_send(self, target, message):
        """Send a message (bytes, at most NOTIFY_MAX) to a Segment or "host:port"."""
        seg = self._segment_of(target)
        msg = bytes(message)
        check(lib.ote_notify_send(self.handle, seg.handle, msg, len(msg)), "ote_notify_send")

    def notify_drain(self):
        """Every queued Notification(message, sender, name) at once, in arrival order, without
        waiting ([] when none; ote_notify_drain, one C call per 64 messages)."""
        out = []
        recs = (_lib.Notification * 64)()
        data = ctypes.create_string_buffer(64 * NOTIFY_MAX)
        n = ctypes.c_size_t()
        while True:
            check(lib.ote_notify_drain(self.handle, recs, 64, data, len(data), ctypes.byref(n)),
                  "ote_notify_drain")
            raw = data.raw
            out.extend(Notification(raw[r.offset:r.offset + r.len], r.sender.decode(),
                                    r.name.decode("ascii", "replace"))
                       for r in recs[:n.value])
            if n.value == 0:
                return out

    def notify_recv(self, timeout=1.0):
        """The next Notification(message, sender, name) sent to this engine, or None when
        none arrives within `timeout` seconds (the wait runs in C without the GIL)."""
        buf = ctypes.create_string_buffer(NOTIFY_MAX)
        sender = ctypes.create_string_buffer(272)
        name = ctypes.create_string_buffer(64)
        n = ctypes.c_size_t()
        st = lib.ote_notify_recv_ex(self.handle, buf, len(buf), ctypes.byref(n), sender,
                                    len(sender), name, len(name), _ns(timeout))
        if st == _OTE_ERR_TIMEOUT:
            return None
        check(st, "ote_notify_recv")
        return Notification(buf.raw[: n.value], sender.value.decode(),
                            name.value.decode("ascii", "replace"))

    # ---- closing ----
    def close(self):
        """Close every batch (canceling what is pending), segment and registration, then
        destroy the engine. Raises the first failure; what could not be closed stays."""
        with self._lock:
            if not self._handle:
                return
            first = None
            for batch in list(self._batches):
                try:
                    batch.close()
                except Exception as e:  # keep closing the rest, report the first
                    first = first or e
            for seg in list(self._segments):
                try:
                    seg.close()
                except Exception as e:
                    first = first or e
            for reg in list(self._registrations.values()):
                try:
                    self.unregister(reg)
                except Exception as e:
                    first = first or e
            for shm in list(self._shared.values()):
                try:
                    self.free_shared(shm)
                except Exception as e:
                    first = first or e
            if first is not None:
                raise first
            check(lib.ote_engine_destroy(self._handle), "ote_engine_destroy")
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "Engine(%s)" % (self.address if self._handle else "closed")
