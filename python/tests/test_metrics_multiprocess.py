"""Prometheus export of several engines (issue 28): Collector over a mapping of engines
of one process, and the multi-process mode: worker processes each run a SnapshotWriter
into one directory, the exporting process scrapes a DirectoryCollector over HTTP
(start_http_server on a free loopback port, read with urllib) and finds each worker's
byte totals under its pid and engine name; a worker that closes its writer, and one that
is killed, leave the scrape."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request

import numpy as np
import pytest

import orbitte

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import orbitte.metrics  # noqa: E402
from orbitte.stats import engine_stats_from_dict, engine_stats_to_dict  # noqa: E402

CFG = {"listen_address": "127.0.0.1:0", "transports": "tcp"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(registry):
    port = free_port()
    prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def sample(m, name, **labels):
    return m[(name, tuple(sorted(labels.items())))]


def names_of(m, name):
    """The (pid, engine) label pairs of metric name's samples."""
    return {(dict(k[1]).get("pid"), dict(k[1]).get("engine")) for k in m if k[0] == name}


def write_bytes(a, b, n):
    """Move n bytes a -> b over tcp (WRITE)."""
    remote = np.zeros(n, np.uint8)
    reg = b.register(remote)
    seg = a.open_segment(b.address)
    with a.batch(1) as bt:
        bt.submit([(orbitte.WRITE, np.full(n, 7, np.uint8), seg, reg.address)])
        bt.wait(timeout=30)
    return remote


def test_collector_of_several_engines_labels_each():
    with orbitte.Engine(CFG) as a, orbitte.Engine(CFG) as c, orbitte.Engine(CFG) as b:
        keep = [write_bytes(a, b, 4096), write_bytes(c, b, 12288)]
        registry = prometheus_client.CollectorRegistry()
        registry.register(orbitte.metrics.Collector({"prefill": a, "decode": c},
                                                    {"job": "t"}))
        m = scrape(registry)
        assert sample(m, "orbitte_tx_bytes_total", job="t", engine="prefill",
                      transport="tcp") == 4096
        assert sample(m, "orbitte_tx_bytes_total", job="t", engine="decode",
                      transport="tcp") == 12288
        assert sample(m, "orbitte_requests_total", job="t", engine="decode", op="write",
                      transport="tcp", status="completed") == 1
        assert sample(m, "orbitte_memory_registrations", job="t", engine="prefill",
                      kind="host") == 0
        del keep


def test_stats_round_trip_through_plain_data():
    with orbitte.Engine(CFG) as a, orbitte.Engine(CFG) as b:
        keep = write_bytes(a, b, 8192)
        s = a.stats()
        d = json.loads(json.dumps(engine_stats_to_dict(s)))
        assert engine_stats_from_dict(d) == s
        with pytest.raises(ValueError):
            engine_stats_from_dict({"transports": {"tcp": {}}})
        del keep


# A worker: two engines, n bytes written, a SnapshotWriter named argv[3] into argv[1];
# prints "ready" and its pid, then waits for a line on stdin: "close" closes the writer
# (and the engines) and exits.
WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import orbitte
    import orbitte.metrics
    cfg = {"listen_address": "127.0.0.1:0", "transports": "tcp"}
    a, b = orbitte.Engine(cfg), orbitte.Engine(cfg)
    n = int(sys.argv[2])
    remote = np.zeros(n, np.uint8)
    reg = b.register(remote)
    seg = a.open_segment(b.address)
    with a.batch(1) as bt:
        bt.submit([(orbitte.WRITE, np.full(n, 3, np.uint8), seg, reg.address)])
        bt.wait(timeout=30)
    w = orbitte.metrics.SnapshotWriter(a, sys.argv[1], name=sys.argv[3], interval_s=0.05)
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "close":
        w.close()
        seg.close()
        a.close()
        b.close()
""")


def start_worker(directory, n, name):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(orbitte.__file__)),
                                         env.get("PYTHONPATH", "")])
    p = subprocess.Popen([sys.executable, "-c", WORKER, directory, str(n), name],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    assert line.strip() == "ready", line
    return p


def test_directory_collector_scrapes_worker_processes(tmp_path):
    d = str(tmp_path / "metrics")
    w1 = start_worker(d, 4096, "prefill-0")
    w2 = start_worker(d, 65536, "decode 1")
    w3 = start_worker(d, 8192, "killed")
    try:
        # A stray file that is not a snapshot is skipped, the others still exported.
        with open(os.path.join(d, "orbitte-0-0.json"), "w") as f:
            f.write("{not json")
        registry = prometheus_client.CollectorRegistry()
        registry.register(orbitte.metrics.DirectoryCollector(d, {"job": "vllm"}))
        m = scrape(registry)
        for p, n, name in ((w1, 4096, "prefill-0"), (w2, 65536, "decode 1"),
                           (w3, 8192, "killed")):
            lb = {"job": "vllm", "pid": str(p.pid), "engine": name}
            assert sample(m, "orbitte_tx_bytes_total", transport="tcp", **lb) == n
            assert sample(m, "orbitte_requests_total", op="write", transport="tcp",
                          status="completed", **lb) == 1
            assert sample(m, "orbitte_request_duration_seconds_count", transport="tcp",
                          **lb) == 1
            assert sample(m, "orbitte_peers", transport="tcp", **lb) == 1

        # w1 closes its writer (its file goes); w3 is killed (its file stays, its pid is
        # gone): only w2 is left in the scrape.
        w1.stdin.write("close\n")
        w1.stdin.flush()
        assert w1.wait(timeout=60) == 0
        w3.send_signal(signal.SIGKILL)
        w3.wait(timeout=60)
        assert any(str(w3.pid) in f for f in os.listdir(d))
        m = scrape(registry)
        assert names_of(m, "orbitte_tx_bytes_total") == {(str(w2.pid), "decode 1")}
    finally:
        for p in (w1, w2, w3):
            if p.poll() is None:
                p.stdin.write("close\n")
                p.stdin.flush()
                p.wait(timeout=60)
