"""Statistics and Prometheus export (issue 28): Engine.stats(), Segment.stats(),
Batch.status(i) timing, and orbitte.metrics.Collector scraped over HTTP
(prometheus_client.start_http_server on a free loopback port, read with urllib): the byte
totals equal what was moved over shm, tcp and rdma (verbs/sim), and a refused request
counts as one failure."""

import socket
import urllib.request

import numpy as np
import pytest

import orbitte

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import orbitte.metrics  # noqa: E402

SIZE = 1 << 20
# Per transport: (WRITE lengths, READ lengths); one more READ is refused.
PLAN = {"shm": ([4096, 65536], [8192]), "tcp": ([100000], [4096, 12288]),
        "rdma": ([262144], [65536])}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def sample(m, name, **labels):
    return m[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def engines():
    """A requester offering shm, tcp and rdma, and one peer per transport that offers only
    that one (so each segment takes it)."""
    base = {"listen_address": "127.0.0.1:0", "verbs_provider": "sim"}
    req = orbitte.Engine(dict(base, transports="shm,tcp,rdma"))
    peers = {t: orbitte.Engine(dict(base, transports=t)) for t in PLAN}
    yield req, peers
    req.close()
    for p in peers.values():
        p.close()


def test_collector_scraped_over_http_counts_the_bytes_moved(engines):
    req, peers = engines
    local = np.arange(SIZE, dtype=np.uint32).astype(np.uint8)
    req.register(local)
    moved = {}
    for t, (writes, reads) in PLAN.items():
        remote = np.zeros(SIZE, np.uint8)
        reg = peers[t].register(remote)
        seg = req.open_segment(peers[t].address)
        assert seg.transport == t
        with req.batch(8) as b:
            off, reqs = 0, []
            for op, lens in ((orbitte.WRITE, writes), (orbitte.READ, reads)):
                for n in lens:
                    reqs.append((op, local[off:off + n], seg, reg.address + off))
                    off += n
            b.submit(reqs)
            b.wait(timeout=30)
            for i in range(len(reqs)):
                st = b.status(i)
                assert st.state == "COMPLETED" and st.transport == t
                assert st.end_ns >= st.submit_ns > 0 and st.latency >= 0
            b.reset()
            b.submit([(orbitte.READ, local[:4096], seg, reg.address + SIZE)])  # refused
            with pytest.raises(orbitte.OrbitteError):
                b.wait(timeout=30)
            assert b.status(0).state == "FAILED"
        moved[t] = (sum(writes), sum(reads), len(writes) + len(reads))
        s = seg.stats()
        assert (s.transport, s.requests.bytes_written, s.requests.bytes_read) == (t, *moved[t][:2])
        assert s.requests.failed == {"read": 1, "write": 0}
        assert sum(s.requests.latency_us_buckets) == moved[t][2] + 1

    labels = {"instance": "test"}
    registry = prometheus_client.CollectorRegistry()
    registry.register(orbitte.metrics.Collector(req, labels))
    port = free_port()
    prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    m = scrape(port)
    for t, (wbytes, rbytes, nok) in moved.items():
        assert sample(m, "orbitte_tx_bytes_total", transport=t, **labels) == wbytes
        assert sample(m, "orbitte_rx_bytes_total", transport=t, **labels) == rbytes
        assert sample(m, "orbitte_requests_total", op="read", transport=t, status="failed",
                      **labels) == 1
        assert sample(m, "orbitte_requests_total", op="write", transport=t, status="failed",
                      **labels) == 0
        done = sum(sample(m, "orbitte_requests_total", op=op, transport=t, status="completed",
                          **labels) for op in ("read", "write"))
        assert done == nok
        assert sample(m, "orbitte_request_duration_seconds_count", transport=t,
                      **labels) == nok + 1
        assert sample(m, "orbitte_request_duration_seconds_bucket", transport=t, le="+Inf",
                      **labels) == nok + 1
        assert sample(m, "orbitte_peers", transport=t, **labels) == 1
        assert sample(m, "orbitte_inflight_requests", transport=t, **labels) == 0
    assert sample(m, "orbitte_memory_registrations", kind="host", **labels) == 1
    assert sample(m, "orbitte_memory_registered_bytes", kind="host", **labels) == SIZE
    # No file registration here: the file READ counters are exported, at 0.
    assert sample(m, "orbitte_file_read_mapped_bytes_total", **labels) == 0
    assert sample(m, "orbitte_file_read_bounced_bytes_total", **labels) == 0


def test_engine_stats_dataclass_and_notifications(engines):
    req, peers = engines
    seg = req.open_segment(peers["tcp"].address)
    req.notify_send(seg, b"hello")
    s = req.stats()
    assert set(s.transports) == {"shm", "tcp", "rdma", "file"}  # file: the local segment
    assert all(t.enabled for n, t in s.transports.items() if n != "file")
    assert s.transports["file"].enabled is False
    assert s.transports["tcp"].peers_now == 1
    assert s.notify_sent == 1 and s.notify_send_failed == 0
    assert peers["tcp"].stats().notify_received == 1
    assert peers["shm"].stats().transports["rdma"].enabled is False
