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
Only the transports of the engine's list are exported. Needs prometheus_client (Debian:
python3-prometheus-client).
"""

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from .stats import LATENCY_BUCKETS, MEM_KINDS, OPS

_STATUSES = (("completed", "completed"), ("failed", "failed"), ("canceled", "canceled"),
             ("timed_out", "timeout"))


def _bucket_bounds():
    """Prometheus' le of each histogram bucket, in seconds: 2**i microseconds, the last
    one +Inf."""
    bounds = [repr((2 ** i) / 1e6) for i in range(LATENCY_BUCKETS - 1)]
    return bounds + ["+Inf"]


class Collector:
    """A prometheus_client collector of one orbitte.Engine. labels: constant labels added to
    every metric (a dict of str to str, e.g. {"instance": "decode-3"})."""

    def __init__(self, engine, labels=None):
        self.engine = engine
        self.labels = dict(labels or {})
        self._names = list(self.labels)
        self._values = [str(v) for v in self.labels.values()]
        self._bounds = _bucket_bounds()

    def _family(self, kind, name, doc, extra=()):
        return kind(name, doc, labels=self._names + list(extra))

    def describe(self):
        return []  # read on scrape only: no scrape at registration time

    def collect(self):
        s = self.engine.stats()
        yield from self._requests(s)
        yield from self._engine(s)

    def _requests(self, s):
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
        for name, t in s.transports.items():
            if not t.enabled:
                continue
            r, lv = t.requests, self._values + [name]
            for op in OPS:
                submitted.add_metric(self._values + [op, name], r.submitted[op])
                for field, status in _STATUSES:
                    ended.add_metric(self._values + [op, name, status], getattr(r, field)[op])
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
        return [submitted, ended, rx, tx, infl, inflb, peers, hist]

    def _engine(self, s):
        regs = self._family(GaugeMetricFamily, "orbitte_memory_registrations",
                            "Live registrations, by memory kind", ("kind",))
        regb = self._family(GaugeMetricFamily, "orbitte_memory_registered_bytes",
                            "Registered bytes, by memory kind", ("kind",))
        for k in MEM_KINDS:
            regs.add_metric(self._values + [k], s.registrations_kind_now[k])
            regb.add_metric(self._values + [k], s.registered_bytes_kind_now[k])
        out = [regs, regb]
        for name, doc, value in (
            ("orbitte_memory_registered", "Registrations made", s.registrations_total),
            ("orbitte_notifications_sent", "Notifications acknowledged by their receiver",
             s.notify_sent),
            ("orbitte_notifications_send_failed", "Notifications that failed",
             s.notify_send_failed),
            ("orbitte_notifications_received", "Notifications queued here", s.notify_received),
            ("orbitte_notifications_refused", "Notifications refused here (queue full)",
             s.notify_refused),
            ("orbitte_auth_failures", "Connections to this engine that failed to authenticate",
             s.auth_failures),
            ("orbitte_auth_backoff_refused", "Connections closed unheard (address backing off)",
             s.auth_backoff_refused),
            ("orbitte_auth_open_failures", "Segment opens that failed authentication",
             s.auth_open_failures),
        ):
            c = self._family(CounterMetricFamily, name, doc)
            c.add_metric(self._values, value)
            out.append(c)
        return out
