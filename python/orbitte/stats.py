"""Counters of an engine and of a segment (ote_engine_stats, ote_segment_stats) as
dataclasses: Engine.stats() and Segment.stats() return them, orbitte.metrics exports them.

Counters grow from the engine's creation (a segment's from its opening); the *_now fields
are the present state. Opcodes are "read" and "write"; transports "shm", "tcp", "rdma".
"""

import ctypes
import dataclasses
from dataclasses import dataclass, field

from . import _lib

OPS = ("read", "write")  # OTE_READ, OTE_WRITE
MEM_KINDS = ("host", "host_pinned", "cuda")  # OTE_STATS_MEM_*
# Bucket i of a latency histogram holds requests that took less than 2**i microseconds
# (and at least 2**(i-1)); the last one everything longer.
LATENCY_BUCKETS = _lib.STATS_LATENCY_BUCKETS
TRANSPORT_NAMES = ("shm", "tcp", "rdma", "file")  # by ote_transport_id_t (file: the local segment)


@dataclass(frozen=True)
class RequestStats:
    """Requests, by opcode ({"read": n, "write": n}) where a field is a dict. Every
    submitted request ends once: completed, failed, canceled or timed_out."""

    submitted: dict
    completed: dict
    failed: dict
    canceled: dict
    timed_out: dict
    bytes_read: int  # moved by ended READs (bytes done: a failed one's proven bytes too)
    bytes_written: int  # moved by ended WRITEs
    inflight_requests_now: int
    inflight_bytes_now: int
    latency_sum_s: float  # submit to end, summed over ended requests
    latency_us_buckets: tuple  # LATENCY_BUCKETS counts of ended requests (see above)

    @property
    def ended(self):
        return sum(sum(d.values()) for d in
                   (self.completed, self.failed, self.canceled, self.timed_out))


@dataclass(frozen=True)
class TransportStats:
    name: str
    enabled: bool  # in the engine's transports list
    peers_now: int  # segments open over it now
    requests: RequestStats


@dataclass(frozen=True)
class EngineStats:
    transports: dict  # name -> TransportStats, for shm, tcp and rdma
    registrations_now: int
    registered_bytes_now: int
    registrations_kind_now: dict  # MEM_KINDS -> count
    registered_bytes_kind_now: dict  # MEM_KINDS -> bytes
    registrations_total: int
    notify_sent: int  # acknowledged by their receiver
    notify_send_failed: int
    notify_received: int
    notify_refused: int  # refused here: the queue was full
    auth_failures: int  # connections to this engine that failed to authenticate
    auth_backoff_refused: int  # closed unheard: their address was backing off
    auth_open_failures: int  # this engine's segment opens that failed with OTE_ERR_AUTH
    # Peers' requests to this engine's file registrations: bytes of READs sent from the
    # page cache (file_zero_copy), bytes read from files into bounce buffers (READs, and
    # rdma's WRITEs). 0 from an older library.
    file_read_bytes_mapped: int = 0
    file_read_bytes_bounced: int = 0
    struct_size: int = field(default=0, repr=False)  # what the library filled


@dataclass(frozen=True)
class SegmentStats:
    transport: str
    peer: str
    requests: RequestStats
    notify_sent: int
    notify_send_failed: int


def _by_op(arr):
    return {op: int(arr[i]) for i, op in enumerate(OPS)}


def request_stats(r):
    """RequestStats of an ote_request_stats_t."""
    return RequestStats(
        submitted=_by_op(r.submitted), completed=_by_op(r.completed), failed=_by_op(r.failed),
        canceled=_by_op(r.canceled), timed_out=_by_op(r.timed_out), bytes_read=int(r.bytes[0]),
        bytes_written=int(r.bytes[1]), inflight_requests_now=int(r.inflight_requests_now),
        inflight_bytes_now=int(r.inflight_bytes_now), latency_sum_s=r.latency_ns_sum / 1e9,
        latency_us_buckets=tuple(int(x) for x in r.latency_us))


def engine_stats(lib, handle, check):
    """EngineStats of the engine handle (ote_engine_stats)."""
    s = _lib.EngineStats()
    s.struct_size = ctypes.sizeof(s)
    check(lib.ote_engine_stats(handle, ctypes.byref(s)), "ote_engine_stats")
    transports = {}
    for t in s.transport:
        name = t.name.decode("ascii")
        if name:
            transports[name] = TransportStats(name, bool(t.enabled), int(t.peers_now),
                                              request_stats(t.requests))
    return EngineStats(
        transports=transports, registrations_now=int(s.registrations_now),
        registered_bytes_now=int(s.registered_bytes_now),
        registrations_kind_now={k: int(s.registrations_kind_now[i])
                                for i, k in enumerate(MEM_KINDS)},
        registered_bytes_kind_now={k: int(s.registered_bytes_kind_now[i])
                                   for i, k in enumerate(MEM_KINDS)},
        registrations_total=int(s.registrations_total), notify_sent=int(s.notify_sent),
        notify_send_failed=int(s.notify_send_failed), notify_received=int(s.notify_received),
        notify_refused=int(s.notify_refused), auth_failures=int(s.auth_failures),
        auth_backoff_refused=int(s.auth_backoff_refused),
        auth_open_failures=int(s.auth_open_failures),
        file_read_bytes_mapped=int(s.file_read_bytes_mapped),
        file_read_bytes_bounced=int(s.file_read_bytes_bounced), struct_size=int(s.struct_size))


def segment_stats(lib, handle, check):
    """SegmentStats of the segment handle (ote_segment_stats)."""
    s = _lib.SegmentStats()
    s.struct_size = ctypes.sizeof(s)
    check(lib.ote_segment_stats(handle, ctypes.byref(s)), "ote_segment_stats")
    return SegmentStats(transport=s.transport.decode("ascii"), peer=s.peer.decode(),
                        requests=request_stats(s.requests), notify_sent=int(s.notify_sent),
                        notify_send_failed=int(s.notify_send_failed))


def engine_stats_to_dict(s):
    """EngineStats as plain data (dicts, lists, numbers, strings): what json.dumps takes."""
    return dataclasses.asdict(s)


def engine_stats_from_dict(d):
    """The EngineStats that engine_stats_to_dict gave d for (ValueError when d is not one)."""
    try:
        transports = {}
        for name, t in d["transports"].items():
            r = dict(t["requests"])
            r["latency_us_buckets"] = tuple(int(x) for x in r["latency_us_buckets"])
            transports[name] = TransportStats(t["name"], bool(t["enabled"]), int(t["peers_now"]),
                                              RequestStats(**r))
        rest = {k: v for k, v in d.items() if k != "transports"}
        return EngineStats(transports=transports, **rest)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError("not the data of an EngineStats: %s" % e) from e
