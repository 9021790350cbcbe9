"""orbitte.mooncake: Mooncake's Python TransferEngine surface over OrbitTE.

Inference servers (SGLang's MooncakeTransferEngine wrapper, vLLM's Mooncake connector)
call `mooncake.engine.TransferEngine`. This class answers the same calls with the same
conventions, so such a caller changes an import (or calls `orbitte.mooncake.install()`
first, which makes `from mooncake.engine import TransferEngine` resolve here; opt-in,
and never when a real `mooncake` package is importable). Both ends must run OrbitTE: the
wire protocol is OrbitTE's, not Mooncake's.

Conventions kept (from Mooncake's pybind module and its callers):
- Integer returns, never exceptions, on the transfer paths: 0 or -1 for the synchronous
  calls, a batch id (never 0) or 0 for the asynchronous ones, 1/0/-1/-2 from
  transfer_check_status; registration errors as Mooncake's negative codes (-1 invalid
  argument, -3 address not registered, -7 overlapping region). A failure is logged on
  the "orbitte.mooncake" logger with its OrbitTE status.
- `initialize(local_hostname, "P2PHANDSHAKE", protocol, device_name)`: the port in
  local_hostname is ignored; the engine listens on a free port of that host, and the
  session id peers use is "host:get_rpc_port()". `protocol` "tcp" maps to transports
  shm,tcp (same-host peers over shared memory), "rdma" to shm,rdma, falling back to
  shm,tcp with one WARN when no RDMA device is usable (as Mooncake does); `device_name`
  (a comma list) to rdma_devices.
- `initialize(local_hostname, "etcd://h:p[,h:p]" | "redis://h:p", ...)` (or a bare
  "h:p" with metadata_type "etcd" / "redis" in initialize_ext): the engine is published
  under the segment name local_hostname (orbitte.naming, a lease kept alive until
  close()); target_hostname in the transfer calls is then a segment name, resolved in
  that store (get_session_id() returns the name). Other metadata servers (http://)
  return -1 with an ERROR.
- MC_TRANSFER_TIMEOUT (seconds, at least 5; default 30) becomes transfer_timeout_ms and
  the synchronous calls' deadline (plus 1 ns per byte, as Mooncake); MC_FORCE_TCP=1 maps
  any protocol to tcp; MC_LOG_LEVEL to log_level; MC_GID_INDEX to rdma_gid_index (a
  negative one, Mooncake's "choose", leaves the engine's ranked choice): each logged once
  at INFO when applied.
- get_notifies() drains every queued notification as TransferNotify(name, msg): the name
  its sender gave (transfer_sync's notify, as Mooncake), or for a plain OrbitTE
  notification the sender's engine name (config key engine_name, OTE_ENGINE_NAME), else
  its "host:port".
- transfer_{write,read}_on_cuda and batch_transfer_{write,read}_on_cuda: the transfer
  starts after the work queued on the CUDA stream before the call, and the stream's later
  work follows it, as Mooncake's; but the call synchronizes the stream (torch or
  cuda-python, else RuntimeError) and returns once the transfer is done instead of
  enqueueing it on the stream, and a failure raises RuntimeError instead of ending the
  process.
- Remote addresses are the peer's absolute addresses inside its registered memory.
- Threads: no lock of this module or of the engine is held across a network call; a
  session being opened holds up only callers of that peer.
"""

import ctypes
import enum
import json
import logging
import os
import struct
import sys
import threading
import time
import types

from . import engine as _engine
from .errors import OrbitteError, PeerError

log = logging.getLogger("orbitte.mooncake")

P2PHANDSHAKE = "P2PHANDSHAKE"
_NOTIFY_MAGIC = b"OTMN"  # name-and-message framing of a TransferNotify on the wire
_STATUS_COMPLETED, _STATUS_PENDING, _STATUS_FAILED, _STATUS_TIMEOUT = 1, 0, -1, -2
_ERR_INVALID_ARGUMENT, _ERR_ADDRESS_NOT_REGISTERED, _ERR_ADDRESS_OVERLAPPED = -1, -3, -7


class TransferOpcode(enum.IntEnum):
    """Mooncake's opcode enum: Read = 0, Write = 1 (also READ / WRITE)."""

    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


class TransferNotify:
    """A notification: a name (the sender's choice, e.g. a request id) and a message."""

    def __init__(self, name="", msg=""):
        self.name, self.msg = name, msg

    def __repr__(self):
        return "TransferNotify(name=%r, msg=%r)" % (self.name, self.msg)

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)


def _encode_notify(notify):
    name = str(notify.name).encode("utf-8")
    msg = notify.msg.encode("utf-8") if isinstance(notify.msg, str) else bytes(notify.msg)
    return _NOTIFY_MAGIC + struct.pack("<I", len(name)) + name + msg


def _decode_notify(message, sender, engine_name=""):
    """A TransferNotify from a received message: framed by this module (the name the
    sender gave, as Mooncake's NotifyDesc), else the whole message as msg with the
    sender's engine name (its engine_name) as name, or its address when it has none (a
    plain OrbitTE notification)."""
    if message.startswith(_NOTIFY_MAGIC) and len(message) >= 8:
        (n,) = struct.unpack_from("<I", message, 4)
        if 8 + n <= len(message):
            name = message[8:8 + n].decode("utf-8", "replace")
            return TransferNotify(name, message[8 + n:].decode("utf-8", "replace"))
    return TransferNotify(engine_name or sender, message.decode("utf-8", "replace"))


def _store_url(metadata_server, metadata_type):
    """The orbitte.naming url of a Mooncake metadata server, or None (P2PHANDSHAKE, http)."""
    server = str(metadata_server or "")
    if server.startswith(("etcd://", "redis://")):
        return server
    kind = str(metadata_type or "").lower()
    if kind in ("etcd", "redis") and server and server != P2PHANDSHAKE and "://" not in server:
        return "%s://%s" % (kind, server)
    return None


def _split_host(hostname):
    """(host, port or None) of "host", "host:port", "[v6]:port" or a bare IPv6 address."""
    h = str(hostname).strip()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            raise ValueError("unbalanced '[' in %r" % hostname)
        rest = h[end + 1:]
        return h[1:end], int(rest[1:]) if rest.startswith(":") and rest[1:] else None
    if h.count(":") == 1:
        host, port = h.split(":")
        return host, int(port) if port else None
    return h, None  # a name, an IPv4 address or a bare IPv6 address


def _env_config():
    """Engine settings from Mooncake's MC_* variables, each logged once when applied."""
    cfg = {}
    t = os.environ.get("MC_TRANSFER_TIMEOUT")
    if t:
        try:
            secs = max(5, int(t))
            cfg["transfer_timeout_ms"] = secs * 1000
            log.info("MC_TRANSFER_TIMEOUT=%s: transfer_timeout_ms=%d", t, secs * 1000)
        except ValueError:
            log.warning("MC_TRANSFER_TIMEOUT=%r is not a number of seconds: ignored", t)
    level = os.environ.get("MC_LOG_LEVEL")
    if level:
        mapped = {"trace": "debug", "debug": "debug", "info": "info", "warning": "warn",
                  "warn": "warn", "error": "error"}.get(level.lower())
        if mapped:
            cfg["log_level"] = mapped
            log.info("MC_LOG_LEVEL=%s: log_level=%s", level, mapped)
    gid = os.environ.get("MC_GID_INDEX", "").strip()
    if gid.startswith("-") and gid[1:].isdigit():  # Mooncake's "choose one": ours ranks
        log.info("MC_GID_INDEX=%s: automatic GID choice", gid)
    elif gid:  # anything else is the engine's to check (0..255; else initialize fails)
        cfg["rdma_gid_index"] = gid
        log.info("MC_GID_INDEX=%s: rdma_gid_index=%s", gid, gid)
    return cfg


class _Async:
    """A batch submitted asynchronously: its OrbitTE batch, peer and Mooncake's deadline."""

    def __init__(self, batch, target, deadline):
        self.batch, self.target, self.deadline = batch, target, deadline


class TransferEngine:
    """Mooncake's TransferEngine (see the module's documentation)."""

    TransferOpcode = TransferOpcode

    def __init__(self):
        self._engine = None
        self._lock = threading.Lock()  # the tables below; never held across a call into C
        self._batches = {}  # batch id -> _Async
        self._next_id = 1
        self._managed = {}  # address -> (ctypes buffer, length)
        self._order = []  # registered addresses in registration order
        self._regions = {}  # address -> length
        self._naming = None  # orbitte.naming.Naming with a metadata server
        self._name = None  # this engine's segment name there
        t = os.environ.get("MC_TRANSFER_TIMEOUT")
        try:
            self._timeout_s = max(5, int(t)) if t else 30
        except ValueError:
            self._timeout_s = 30

    # ---- setup ---------------------------------------------------------------------
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "p2p")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        if self._engine is not None:
            log.error("initialize: this TransferEngine is already initialized")
            return -1
        store = _store_url(metadata_server, metadata_type)
        if str(metadata_server) != P2PHANDSHAKE and store is None:
            log.error("initialize: metadata server %r (%s) is not supported: OrbitTE serves "
                      "%r, etcd:// and redis://", metadata_server, metadata_type, P2PHANDSHAKE)
            return -1
        try:
            host, _ = _split_host(local_hostname)
        except ValueError as e:
            log.error("initialize: local_hostname %r: %s", local_hostname, e)
            return -1
        listen = "[%s]:0" % host if ":" in host else "%s:0" % host
        proto = str(protocol or "tcp").lower()
        if os.environ.get("MC_FORCE_TCP", "") in ("1", "true", "TRUE", "True"):
            if proto != "tcp":
                log.info("MC_FORCE_TCP=1: protocol %s becomes tcp", proto)
            proto = "tcp"
        cfg = dict(_env_config(), listen_address=listen)
        if proto == "rdma":
            cfg["transports"] = "shm,rdma"
            if device_name:
                cfg["rdma_devices"] = str(device_name)
        elif proto == "tcp":
            cfg["transports"] = "shm,tcp"
        else:
            log.error("initialize: protocol %r is not one OrbitTE serves (tcp, rdma)", protocol)
            return -1
        try:
            self._engine = _engine.Engine(cfg)
        except OrbitteError as e:
            if proto != "rdma":
                log.error("initialize: %s", e)
                return -1
            log.warning("initialize: no usable RDMA device (%s): falling back to tcp, as "
                        "Mooncake does", e)
            cfg["transports"] = "shm,tcp"
            cfg.pop("rdma_devices", None)
            try:
                self._engine = _engine.Engine(cfg)
            except OrbitteError as e2:
                log.error("initialize: %s", e2)
                return -1
        if store is not None:
            return self._publish(store, str(local_hostname))
        return 0

    def _publish(self, store, name):
        """Publish the engine under name in store; segment names resolve there from now."""
        from . import naming  # liborbitte_naming.so: loaded only with a metadata server
        try:
            self._naming = naming.Naming(store)
            self._naming.publish(name, self._engine)
        except (OrbitteError, ImportError) as e:
            log.error("initialize: publishing %r in %s: %s", name, store, e)
            if self._naming is not None:
                self._naming.close()
                self._naming = None
            self._engine.close()
            self._engine = None
            return -1
        self._name = name
        self._engine.session_opener = lambda target: self._naming.open_segment(
            self._engine, target)
        return 0

    def _eng(self):
        if self._engine is None or self._engine.closed:
            raise RuntimeError("TransferEngine is not initialized")
        return self._engine

    def get_rpc_port(self):
        return int(self._eng().address.rsplit(":", 1)[1])

    def get_session_id(self):
        """The name peers pass as target_hostname: "host:port" (OrbitTE's address), or the
        segment name published in the metadata server."""
        eng = self._eng()
        return self._name if self._name is not None else eng.address

    def get_engine(self):
        """The orbitte.Engine underneath (Mooncake returns its C++ engine for Mooncake
        Store, which OrbitTE does not have)."""
        return self._eng()

    def get_engine_ptr(self):
        return self._eng().handle

    def close(self):
        """Close the engine (what Mooncake's destructor does)."""
        with self._lock:
            batches, self._batches = list(self._batches.values()), {}
            managed, self._managed = list(self._managed), {}
        for a in batches:
            a.batch.close()
        for addr in managed:
            self._unregister(addr)
        if self._naming is not None:  # withdraws the name
            try:
                self._naming.close()
            except OrbitteError as e:
                log.error("close: withdrawing %r: %s", self._name, e)
            self._naming, self._name = None, None
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # ---- memory --------------------------------------------------------------------
    def register_memory(self, buffer_addr, capacity, location="*"):
        del location  # OrbitTE finds the memory's node and device itself
        if int(capacity) <= 0:
            log.error("register_memory(0x%x, %d): the length must be positive", buffer_addr,
                      capacity)
            return _ERR_INVALID_ARGUMENT
        addr, n = int(buffer_addr), int(capacity)
        with self._lock:
            for a, ln in self._regions.items():
                if addr < a + ln and a < addr + n:
                    log.error("register_memory(0x%x, %d) overlaps [0x%x, +%d)", addr, n, a, ln)
                    return _ERR_ADDRESS_OVERLAPPED
        try:
            self._eng().register(addr, n)
        except (OrbitteError, RuntimeError, ValueError) as e:
            log.error("register_memory(0x%x, %d): %s", addr, n, e)
            return _ERR_INVALID_ARGUMENT
        with self._lock:
            self._regions[addr] = n
            self._order.append(addr)
        return 0

    def _unregister(self, addr):
        try:
            self._eng().unregister(addr)
        except (OrbitteError, RuntimeError) as e:
            log.error("unregister_memory(0x%x): %s", addr, e)
            return -1
        with self._lock:
            self._regions.pop(addr, None)
            if addr in self._order:
                self._order.remove(addr)
        return 0

    def unregister_memory(self, buffer_addr):
        addr = int(buffer_addr)
        with self._lock:
            known = addr in self._regions
        if not known:
            log.error("unregister_memory(0x%x): not registered", addr)
            return _ERR_ADDRESS_NOT_REGISTERED
        return self._unregister(addr)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        addrs, caps = list(buffer_addresses), list(capacities)
        if len(addrs) != len(caps):
            log.error("batch_register_memory: %d addresses, %d capacities", len(addrs), len(caps))
            return _ERR_INVALID_ARGUMENT
        done = []
        for a, c in zip(addrs, caps):
            rc = self.register_memory(a, c, location)
            if rc != 0:
                for d in done:  # all or nothing, as Mooncake
                    self._unregister(d)
                return rc
            done.append(int(a))
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for a in list(buffer_addresses):
            r = self.unregister_memory(a)
            rc = rc or r
        return rc

    def allocate_managed_buffer(self, length):
        """Registered host memory of `length` bytes owned by the engine; its address, or 0."""
        n = int(length)
        if n <= 0:
            return 0
        buf = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(buf)
        if self.register_memory(addr, n) != 0:
            return 0
        with self._lock:
            self._managed[addr] = (buf, n)
        return addr

    def free_managed_buffer(self, buffer_addr, length):
        addr = int(buffer_addr)
        with self._lock:
            entry = self._managed.get(addr)
        if entry is None or entry[1] != int(length):
            log.error("free_managed_buffer(0x%x, %d): no such managed buffer", addr, length)
            return -1
        rc = self._unregister(addr)
        if rc == 0:
            with self._lock:
                self._managed.pop(addr, None)
        return rc

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        data = bytes(src_ptr)[: int(length)]
        ctypes.memmove(int(dest_address), data, len(data))
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        return ctypes.string_at(int(source_address), int(length))

    def get_first_buffer_address(self, segment_name):
        """The peer's first registered buffer: the lowest address of those it registered
        through this API in the order it did, as its buffer discovery lists them; 0 when
        it has none or cannot be reached."""
        try:
            bufs = self._eng().session(segment_name).buffers()
        except (OrbitteError, RuntimeError) as e:
            log.error("get_first_buffer_address(%s): %s", segment_name, e)
            return 0
        return bufs[0].address if bufs else 0

    def get_local_topology(self, device_name=None):
        """JSON: this engine's transports' devices (OrbitTE's NIC statistics)."""
        try:
            nics = self._eng().nic_stats()
        except (OrbitteError, RuntimeError) as e:
            log.error("get_local_topology: %s", e)
            nics = []
        return json.dumps({"devices": [{"transport": x.transport, "name": x.name,
                                        "active": x.active} for x in nics
                                       if not device_name or x.name in str(device_name).split(",")]})

    # ---- transfers -----------------------------------------------------------------
    def _submit(self, target, opcode, buffers, peers, lengths, notify):
        """A batch with the requests submitted (and the notification attached), or None
        (logged): also when the engine is not initialized."""
        try:
            eng = self._eng()
        except RuntimeError as e:
            log.error("%s", e)
            return None
        bufs, rems, lens = list(buffers), list(peers), list(lengths)
        if not len(bufs) == len(rems) == len(lens):
            log.error("transfer to %s: %d buffers, %d peer addresses, %d lengths", target,
                      len(bufs), len(rems), len(lens))
            return None
        if not bufs:
            log.error("transfer to %s: no request", target)
            return None
        batch = None
        try:
            batch = eng.batch(len(bufs))
            batch.submit_arrays(int(opcode), target, bufs, rems, lens)
            if notify is not None:
                batch.notify(target, _encode_notify(notify))
            return batch
        except (OrbitteError, ValueError, TypeError, OverflowError) as e:
            log.error("transfer of %d request(s) to %s: %s", len(bufs), target, e)
            if batch is not None:
                batch.close()
            self._forget_if_lost(target, e)
            return None

    def _forget_if_lost(self, target, e):
        """A peer-scope failure (lost, refused, restarted): the session is dropped, so the
        next call to target opens a new one, as Mooncake re-handshakes."""
        lost = isinstance(e, PeerError) or getattr(e, "name", "") == "OTE_ERR_STATE"
        if lost:
            try:
                self._eng().forget_session(target)
            except (OrbitteError, RuntimeError) as e2:
                log.info("dropping the session to %s: %s", target, e2)

    def _deadline(self, lengths):
        return time.monotonic() + self._timeout_s + sum(int(x) for x in lengths) * 1e-9

    def _finish(self, batch, target, deadline):
        """0 when every request completed by deadline and the batch's notification (if
        any) was delivered, else -1 (logged); closes batch."""
        try:
            batch.wait(max(0.0, deadline - time.monotonic()))
            failed = batch.notify_result()
            if failed is not None:
                log.error("notification to %s: %s", target, failed)
                return -1
            return 0
        except OrbitteError as e:
            log.error("transfer to %s: %s", target, e)
            self._forget_if_lost(target, e)
            return -1
        finally:
            try:
                batch.close()
            except OrbitteError as e:
                log.error("closing the batch to %s: %s", target, e)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        del transport_hint
        lens = list(lengths)
        batch = self._submit(target_hostname, opcode, buffers, peer_buffer_addresses, lens, notify)
        if batch is None:
            return -1
        return self._finish(batch, target_hostname, self._deadline(lens))

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        return self.batch_transfer_sync(target_hostname, [buffer], [peer_buffer_address],
                                        [length], opcode, notify, transport_hint)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Write, None, transport_hint)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Read, None, transport_hint)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Write, None, transport_hint)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Read, None, transport_hint)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        del transport_hint
        lens = list(lengths)
        batch = self._submit(target_hostname, opcode, buffers, peer_buffer_addresses, lens, None)
        if batch is None:
            return 0
        with self._lock:
            bid = self._next_id
            self._next_id += 1
            self._batches[bid] = _Async(batch, target_hostname, self._deadline(lens))
        return bid

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Write, transport_hint)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.Read, transport_hint)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        return self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address],
                                         [length], TransferOpcode.Write, transport_hint)

    def _take(self, bid):
        with self._lock:
            return self._batches.pop(int(bid), None)

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; frees them all; 0 when all completed, else -1."""
        rc = 0
        for bid in list(batch_ids):
            a = self._take(bid)
            if a is None:
                log.error("get_batch_transfer_status: unknown batch id %r", bid)
                rc = -1
                continue
            if self._finish(a.batch, a.target, a.deadline) != 0:
                rc = -1
        return rc

    def transfer_check_status(self, batch_id):
        """1 completed, 0 in progress, -1 failed, -2 timed out (Mooncake's first-request
        status); the batch is freed on 1 and -1, and an unknown id is -1."""
        with self._lock:
            a = self._batches.get(int(batch_id))
        if a is None:
            log.error("transfer_check_status: unknown batch id %r", batch_id)
            return _STATUS_FAILED
        state = a.batch.status(0).state
        if state in ("WAITING", "PENDING"):
            return _STATUS_TIMEOUT if time.monotonic() > a.deadline else _STATUS_PENDING
        done = _STATUS_COMPLETED if state == "COMPLETED" else _STATUS_FAILED
        if self._take(batch_id) is not None:
            a.batch.close()
        return done

    # ---- transfers ordered on a CUDA stream ---------------------------------------------
    # Mooncake (built with USE_CUDA) enqueues a host callback on the stream (its
    # cudaLaunchHostFunc): the transfer starts once the work queued on the stream before
    # the call has finished, and the stream's later work waits for the transfer; the call
    # itself returns at once (None), and a transfer that fails in the callback ends the
    # process. OrbitTE enqueues nothing on a stream: these calls wait for the stream's
    # work so far (_stream_synchronize), then transfer and return once done, so both
    # orders hold, but the calling thread waits for the stream and the transfer. A
    # failure raises RuntimeError (Mooncake raises for mismatched lists and a segment it
    # cannot open).
    def _on_cuda(self, what, target, opcode, buffers, peers, lengths, stream_ptr):
        bufs, rems, lens = list(buffers), list(peers), list(lengths)
        if not len(bufs) == len(rems) == len(lens):
            raise RuntimeError("%s: buffers, peer_buffer_addresses and lengths have different "
                               "size (%d, %d, %d)" % (what, len(bufs), len(rems), len(lens)))
        _stream_synchronize(stream_ptr, what)
        batch = self._submit(target, opcode, bufs, rems, lens, None)
        if batch is None:
            raise RuntimeError("%s to %s: the transfer could not be submitted (the "
                               "orbitte.mooncake log says why)" % (what, target))
        if self._finish(batch, target, self._deadline(lens)) != 0:
            raise RuntimeError("%s to %s: the transfer failed (the orbitte.mooncake log says "
                               "why)" % (what, target))

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint=""):
        """WRITE once the work queued on stream_ptr has finished; returns None once the
        bytes are at the peer (see _on_cuda)."""
        del transport_hint
        self._on_cuda("transfer_write_on_cuda", target_hostname, TransferOpcode.Write, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint=""):
        """READ once the work queued on stream_ptr has finished; returns None once the
        bytes are here (see _on_cuda)."""
        del transport_hint
        self._on_cuda("transfer_read_on_cuda", target_hostname, TransferOpcode.Read, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint=""):
        """batch_transfer_sync_write ordered after the stream's work (see _on_cuda)."""
        del transport_hint
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, TransferOpcode.Write,
                      buffers, peer_buffer_addresses, lengths, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint=""):
        """batch_transfer_sync_read ordered after the stream's work (see _on_cuda)."""
        del transport_hint
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, TransferOpcode.Read,
                      buffers, peer_buffer_addresses, lengths, stream_ptr)

    # ---- notifications and peers ------------------------------------------------------
    def get_notifies(self):
        """Every queued notification, drained at once, as TransferNotify(name, msg)."""
        return [_decode_notify(n.message, n.sender, n.name) for n in self._eng().notify_drain()]

    def send_probe(self, peer_server_name):
        """0 when the peer answers a handshake now (a new session), else -1."""
        try:
            self._eng().forget_session(peer_server_name)
            self._eng().session(peer_server_name)
            return 0
        except (OrbitteError, RuntimeError) as e:
            log.info("send_probe(%s): %s", peer_server_name, e)
            return -1

    def warmup_efa_segment(self, segment_name):
        """Mooncake's EFA warm-up: there is no EFA transport here; opens the session."""
        return 0 if self.send_probe(segment_name) == 0 else -1


def _cuda_runtime():
    """cuda-python's runtime bindings (cuda.bindings.runtime, or the older cuda.cudart),
    or None."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return __import__(name, fromlist=["cudaStreamSynchronize"])
        except ImportError:
            continue
    return None


def _stream_synchronize(stream, what):
    """Wait until the work queued on `stream` so far has finished. `stream` is Mooncake's
    stream_ptr (a cudaStream_t as an integer; 0 is the legacy default stream) or a stream
    object with synchronize() (torch.cuda.Stream, cupy's). An integer goes through torch
    (torch.cuda.ExternalStream) when it is importable with CUDA, else cuda-python's
    cudaStreamSynchronize; with neither, RuntimeError: OrbitTE cannot see the stream."""
    sync = getattr(stream, "synchronize", None)
    if callable(sync):
        sync()
        return
    try:
        handle = int(stream)
    except (TypeError, ValueError):
        raise RuntimeError("%s: stream_ptr must be a cudaStream_t (an integer) or a stream "
                           "with synchronize(), not %r" % (what, stream)) from None
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 (only when the caller has not imported it)
        except ImportError:
            torch = None
    if torch is not None and torch.cuda.is_available():
        s = torch.cuda.default_stream() if handle == 0 else torch.cuda.ExternalStream(handle)
        s.synchronize()
        return
    rt = _cuda_runtime()
    if rt is not None:
        (err,) = rt.cudaStreamSynchronize(rt.cudaStream_t(handle))
        if int(err) != 0:
            raise RuntimeError("%s: cudaStreamSynchronize(0x%x) failed: %s" % (what, handle, err))
        return
    raise RuntimeError("%s: cannot wait for CUDA stream 0x%x: neither torch (with CUDA) nor "
                       "cuda-python is importable; OrbitTE orders a transfer after a stream's "
                       "work by synchronizing the stream first" % (what, handle))


def install():
    """Make `mooncake.engine` resolve to this module (TransferEngine, TransferOpcode,
    TransferNotify), for callers that import Mooncake by name. Opt-in; refused (False)
    when a real mooncake package is importable, which is never shadowed."""
    if "mooncake" in sys.modules and not getattr(sys.modules["mooncake"], "__orbitte__", False):
        return False
    try:
        import importlib.util
        if "mooncake" not in sys.modules and importlib.util.find_spec("mooncake") is not None:
            log.warning("install(): a mooncake package is installed; it is left as it is")
            return False
    except (ImportError, ValueError):
        pass
    pkg = types.ModuleType("mooncake")
    pkg.__orbitte__ = True
    pkg.__path__ = []
    eng = types.ModuleType("mooncake.engine")
    eng.TransferEngine, eng.TransferOpcode, eng.TransferNotify = (
        TransferEngine, TransferOpcode, TransferNotify)
    pkg.engine = eng
    sys.modules["mooncake"] = pkg
    sys.modules["mooncake.engine"] = eng
    return True


