"""Prometheus export of an engine's counters: a prometheus_client custom collector that
reads Engine.stats() on every scrape (nothing is polled in between).

    from prometheus_client import REGISTRY, start_http_server
    from orbitte.metrics import Collector
    REGISTRY.register(Collector(engine, {"instance": "prefill-0"}))
    start_http_server(9400, addr="127.0.0.1")

Metrics (every one carries the constant labels given; NIXL-like names and units):
  orbitte_requests_submitted_total{op,transport}        counter
  orbitte_requests_total{op,transport,status}           counter, status: completed,
                                                        failed, canceled, timeout
  orbitte_rx_bytes_total{transport}                     counter, READ bytes moved here
  orbitte_tx_bytes_total{transport}                     counter, WRITE bytes moved out
  orbitte_inflight_requests{transport}                  gauge
  orbitte_inflight_bytes{transport}                     gauge
  orbitte_peers{transport}                              gauge, segments open
  orbitte_request_duration_seconds{transport}           histogram, submit to end of every
                                                        ended request, buckets 2**i us
  orbitte_memory_registrations{kind}                    gauge, kind: host, host_pinned, cuda
  orbitte_memory_registered_bytes{kind}                 gauge
  orbitte_memory_registered_total                       counter, registrations made
  orbitte_notifications_sent_total / _send_failed_total / _received_total /
  orbitte_notifications_refused_total                   counters
  orbitte_auth_failures_total, orbitte_auth_backoff_refused_total,
  orbitte_auth_open_failures_total                      counters
  orbitte_file_read_mapped_bytes_total,
  orbitte_file_read_bounced_bytes_total                 counters, peers' READs of file
                                                        registrations (docs/files.md)
Only the transports of the engine's list are exported. Needs prometheus_client (Debian:
python3-prometheus-client).

Several engines of one process: Collector({"prefill-0": e0, "decode-0": e1}, labels) adds
an "engine" label with each engine's name to every sample.

Several processes (an inference server's workers behind one scrape endpoint; the role of
NIXL's multi-process exporter and of prometheus_client's multiprocess mode, which custom
collectors cannot use): each worker runs a SnapshotWriter(engine, directory), which writes
the engine's counters to directory/orbitte-<pid>-<n>.json every interval_s seconds (and on
write() and close(); whole files only, by rename); the exporting process registers
DirectoryCollector(directory, labels), which reads every file on each scrape and labels
each sample with the writer's "pid" and "engine". A file of a process that is gone (its
writer closed: the file is removed; killed: the pid no longer exists) is not exported, so
that process's counters leave the scrape, which Prometheus reads as a counter reset.
Values are as fresh as the last write (at most interval_s old while the worker runs).

    # each worker
    writer = SnapshotWriter(engine, "/run/orbitte-metrics", name="decode-3")
    ...
    writer.close()      # before engine.close()
    # the exporter
    REGISTRY.register(DirectoryCollector("/run/orbitte-metrics", {"job": "vllm"}))
    start_http_server(9400)
"""

import glob
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from .stats import (LATENCY_BUCKETS, MEM_KINDS, OPS, engine_stats_from_dict,
                    engine_stats_to_dict)

_STATUSES = (("completed", "completed"), ("failed", "failed"), ("canceled", "canceled"),
             ("timed_out", "timeout"))


def _bucket_bounds():
    """Prometheus' le of each histogram bucket, in seconds: 2**i microseconds, the last
    one +Inf."""
    bounds = [repr((2 ** i) / 1e6) for i in range(LATENCY_BUCKETS - 1)]
    return bounds + ["+Inf"]


class Collector:
    """A prometheus_client collector of orbitte engines. engine: one orbitte.Engine, or a
    mapping of names to Engines of this process (each sample then has an "engine" label:
    its engine's name). labels: constant labels added to every metric (a dict of str to
    str, e.g. {"instance": "decode-3"})."""

    def __init__(self, engine, labels=None):
        self.labels = dict(labels or {})
        self._values = [str(v) for v in self.labels.values()]
        self._bounds = _bucket_bounds()
        if isinstance(engine, Mapping):
            self.engine, self._engines = None, dict(engine)
            self._names = list(self.labels) + ["engine"]
        else:
            self.engine, self._engines = engine, None
            self._names = list(self.labels)

    def _stats(self):
        """[(label values after the constant ones, EngineStats)], read now."""
        if self._engines is None:
            return [([], self.engine.stats())]
        return [([str(name)], e.stats()) for name, e in self._engines.items()]

    def _family(self, kind, name, doc, extra=()):
        return kind(name, doc, labels=self._names + list(extra))

    def describe(self):
        return []  # read on scrape only: no scrape at registration time

    def collect(self):
        items = [(self._values + extra, s) for extra, s in self._stats()]
        yield from self._requests(items)
        yield from self._engine(items)

    def _requests(self, items):
        def fam(kind, name, doc, extra=("transport",)):
            return self._family(kind, name, doc, extra)

        submitted = fam(CounterMetricFamily, "orbitte_requests_submitted",
                        "Requests submitted", ("op", "transport"))
        ended = fam(CounterMetricFamily, "orbitte_requests",
                    "Requests ended, by final status", ("op", "transport", "status"))
        rx = fam(CounterMetricFamily, "orbitte_rx_bytes", "Bytes read from peers (READ)")
        tx = fam(CounterMetricFamily, "orbitte_tx_bytes", "Bytes written to peers (WRITE)")
        infl = fam(GaugeMetricFamily, "orbitte_inflight_requests", "Requests in flight")
        inflb = fam(GaugeMetricFamily, "orbitte_inflight_bytes", "Bytes of requests in flight")
        peers = fam(GaugeMetricFamily, "orbitte_peers", "Segments open")
        hist = fam(HistogramMetricFamily, "orbitte_request_duration_seconds",
                   "Time from submit to end of ended requests")
        for base, s in items:
            for name, t in s.transports.items():
                if t.enabled:
                    self._transport(base, name, t, (submitted, ended, rx, tx, infl, inflb,
                                                    peers, hist))
        return [submitted, ended, rx, tx, infl, inflb, peers, hist]

    def _transport(self, base, name, t, fams):
        submitted, ended, rx, tx, infl, inflb, peers, hist = fams
        r, lv = t.requests, base + [name]
        for op in OPS:
            submitted.add_metric(base + [op, name], r.submitted[op])
            for field, status in _STATUSES:
                ended.add_metric(base + [op, name, status], getattr(r, field)[op])
        rx.add_metric(lv, r.bytes_read)
        tx.add_metric(lv, r.bytes_written)
        infl.add_metric(lv, r.inflight_requests_now)
        inflb.add_metric(lv, r.inflight_bytes_now)
        peers.add_metric(lv, t.peers_now)
        cum, buckets = 0, []
        for le, n in zip(self._bounds, r.latency_us_buckets):
            cum += n
            buckets.append((le, cum))
        hist.add_metric(lv, buckets, r.latency_sum_s)

    def _engine(self, items):
        regs = self._family(GaugeMetricFamily, "orbitte_memory_registrations",
                            "Live registrations, by memory kind", ("kind",))
        regb = self._family(GaugeMetricFamily, "orbitte_memory_registered_bytes",
                            "Registered bytes, by memory kind", ("kind",))
        for base, s in items:
            for k in MEM_KINDS:
                regs.add_metric(base + [k], s.registrations_kind_now[k])
                regb.add_metric(base + [k], s.registered_bytes_kind_now[k])
        out = [regs, regb]
        for name, doc, field in _ENGINE_COUNTERS:
            c = self._family(CounterMetricFamily, name, doc)
            for base, s in items:
                c.add_metric(base, getattr(s, field))
            out.append(c)
        return out


# The engine-wide counters: (metric name, help, EngineStats field).
_ENGINE_COUNTERS = (
    ("orbitte_memory_registered", "Registrations made", "registrations_total"),
    ("orbitte_notifications_sent", "Notifications acknowledged by their receiver",
     "notify_sent"),
    ("orbitte_notifications_send_failed", "Notifications that failed",
     "notify_send_failed"),
    ("orbitte_notifications_received", "Notifications queued here", "notify_received"),
    ("orbitte_notifications_refused", "Notifications refused here (queue full)",
     "notify_refused"),
    ("orbitte_auth_failures", "Connections to this engine that failed to authenticate",
     "auth_failures"),
    ("orbitte_auth_backoff_refused", "Connections closed unheard (address backing off)",
     "auth_backoff_refused"),
    ("orbitte_auth_open_failures", "Segment opens that failed authentication",
     "auth_open_failures"),
    ("orbitte_file_read_mapped_bytes", "Bytes of peers' file READs sent from the page cache",
     "file_read_bytes_mapped"),
    ("orbitte_file_read_bounced_bytes", "Bytes of files read into bounce buffers for peers",
     "file_read_bytes_bounced"),
)

SNAPSHOT_PATTERN = "orbitte-*.json"
_log = logging.getLogger("orbitte")
_serial = itertools.count()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # there, but another user's
    return True


class SnapshotWriter:
    """Writes engine's counters (Engine.stats()) to directory/orbitte-<pid>-<n>.json every
    interval_s seconds from a daemon thread, and on write(); close() stops it and removes
    the file. name: the "engine" label a DirectoryCollector gives its samples (default: the
    engine's address). Close it before the engine; a read that fails (the engine closed
    first) stops the thread with a WARNING on the "orbitte" logger."""

    def __init__(self, engine, directory, name=None, interval_s=1.0):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.engine = engine
        self.name = str(name if name is not None else engine.address)
        self.interval_s = float(interval_s)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "orbitte-%d-%d.json" % (os.getpid(), next(_serial)))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.write()  # the first snapshot before the constructor returns
        self._thread = threading.Thread(target=self._run, name="orbitte-snapshot", daemon=True)
        self._thread.start()

    def write(self):
        """Write the engine's counters now (whole: a temporary file renamed over it)."""
        data = {"pid": os.getpid(), "engine": self.name, "time": time.time(),
                "stats": engine_stats_to_dict(self.engine.stats())}
        with self._lock:
            if self._stop.is_set() and not os.path.exists(self.path):
                return  # closed
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)

    def _run(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.write()
            except Exception as e:  # noqa: BLE001 - the thread must not die silently
                _log.warning("orbitte.metrics: snapshot of %s stopped: %s", self.name, e)
                return

    def close(self):
        """Stop writing and remove the file (its counters leave the scrape)."""
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval_s))
        with self._lock:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DirectoryCollector(Collector):
    """A prometheus_client collector of the SnapshotWriter files in directory, read on each
    scrape: every sample labelled with its writer's "pid" and "engine" (after the constant
    labels). Files of processes that no longer exist, and files that are not a snapshot,
    are skipped (the latter with a WARNING on the "orbitte" logger)."""

    def __init__(self, directory, labels=None):
        super().__init__(None, labels)
        self.directory = directory
        self._names = list(self.labels) + ["pid", "engine"]

    def _stats(self):
        out = []
        for path in sorted(glob.glob(os.path.join(self.directory, SNAPSHOT_PATTERN))):
            try:
                with open(path) as f:
                    d = json.load(f)
                pid, name = int(d["pid"]), str(d["engine"])
                stats = engine_stats_from_dict(d["stats"])
            except FileNotFoundError:
                continue  # its writer closed since the listing
            except (OSError, ValueError, KeyError, TypeError) as e:
                _log.warning("orbitte.metrics: %s is not a snapshot: %s", path, e)
                continue
            if _alive(pid):
                out.append(([str(pid), name], stats))
        return out
