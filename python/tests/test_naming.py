"""orbitte.naming against real servers on loopback (redis-server and etcd, started here
with free ports and temporary directories): publish, resolve, list, watch, open by name,
withdraw. Skipped only when the server binary or liborbitte_naming.so is absent."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import orbitte

naming = pytest.importorskip("orbitte.naming")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(kind, tmp):
    port = _free_port()
    if kind == "redis":
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
               "--save", "", "--appendonly", "no"]
    else:
        peer = _free_port()
        client, purl = "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % peer
        cmd = ["etcd", "--name", "m0", "--data-dir", tmp + "/data", "--listen-client-urls",
               client, "--advertise-client-urls", client, "--listen-peer-urls", purl,
               "--initial-advertise-peer-urls", purl, "--initial-cluster", "m0=" + purl]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "%s://127.0.0.1:%d" % (kind, port)
    deadline = time.monotonic() + 20
    while True:
        try:
            naming.Naming(url, timeout_ms=500).close()
            return proc, url
        except orbitte.OrbitteError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait()
                raise
            time.sleep(0.1)


@pytest.fixture(params=["etcd", "redis"])
def store(request):
    binary = "etcd" if request.param == "etcd" else "redis-server"
    if shutil.which(binary) is None:
        pytest.skip("%s is not installed (scripts/deps.sh)" % binary)
    try:
        naming.find_library()
    except ImportError as e:
        pytest.skip(str(e))
    tmp = tempfile.mkdtemp(prefix="orbitte-naming-")
    proc, url = _server(request.param, tmp)
    yield url
    proc.kill()
    proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


def test_publish_resolve_list_watch_open(store, engine):
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as target, \
            naming.Naming(store, watch_period_ms=100) as names:
        kv = np.arange(4096, dtype=np.uint8) % 251
        reg = target.register(kv, name="kv")
        seen = []
        token = names.watch("decode-3", lambda n, ev, e: seen.append((ev, e)))
        names.publish("decode-3", target)
        names.publish("decode-4", target)
        addr, epoch = names.resolve("decode-3")
        assert addr == target.address and epoch != 0
        assert names.list("decode-") == ["decode-3", "decode-4"]
        assert [b.name for b in orbitte.metadata_buffers(names.metadata("decode-3"))] == ["kv"]
        seg = names.open_segment(engine, "decode-3")
        got = np.zeros(4096, np.uint8)
        engine.read(seg, got, seg.buffer("kv").address)
        assert np.array_equal(got, kv)
        seg.close()
        deadline = time.monotonic() + 5
        while not any(ev == naming.UP for ev, _ in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (naming.UP, (target.address, epoch)) in seen
        names.unpublish("decode-3")
        with pytest.raises(orbitte.NotFoundError):
            names.resolve("decode-3")
        with pytest.raises(orbitte.NotFoundError):
            names.open_segment(engine, "decode-3")
        # The watch's first poll may come before the publish and report GONE then: wait
        # for a GONE after the UP (an ASan run once found the early one and went on).
        up_at = seen.index((naming.UP, (target.address, epoch)))
        deadline = time.monotonic() + 5
        while (not any(ev == naming.GONE for ev, _ in seen[up_at + 1:])
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert seen[-1] == (naming.GONE, None)
        names.unwatch(token)
        reg.unregister()


def test_mooncake_initialize_with_a_metadata_server(store):
    """Mooncake's initialize(local_hostname, "etcd://..." | "redis://...", ...): each engine
    is published under its local_hostname, and a transfer's target_hostname is a segment
    name resolved in the store (here names whose ports nothing listens on: only the name
    service can reach them). close() withdraws the name."""
    from orbitte import mooncake

    decode, prefill = mooncake.TransferEngine(), mooncake.TransferEngine()
    assert decode.initialize("127.0.0.1:5002", store, "tcp", "") == 0
    assert prefill.initialize("127.0.0.1:5001", store, "tcp", "") == 0
    try:
        assert decode.get_session_id() == "127.0.0.1:5002"
        dst = decode.allocate_managed_buffer(1 << 16)
        src = prefill.allocate_managed_buffer(1 << 16)
        assert dst and src
        prefill.write_bytes_to_buffer(src, bytes(range(256)) * 16, 4096)
        remote = prefill.get_first_buffer_address("127.0.0.1:5002")
        assert remote == dst
        assert prefill.transfer_sync_write("127.0.0.1:5002", src, remote, 4096) == 0
        assert decode.read_bytes_from_buffer(dst, 4096) == bytes(range(256)) * 16
    finally:
        decode.close()
    with naming.Naming(store) as names:
        assert names.list("127.0.0.1:") == ["127.0.0.1:5001"]
    prefill.close()


# A publisher process: an engine on tcp with a 1 MiB buffer "kv" of 0x33, published as
# "decode-3" at argv[1] with a 2 s ttl; "ready" once published, then it waits for EOF.
_PUBLISHER = r"""
import sys
import numpy as np
import orbitte
import orbitte.naming as naming
eng = orbitte.Engine({"listen_address": "127.0.0.1:0", "transports": "tcp"})
kv = np.full(1 << 20, 0x33, np.uint8)
reg = eng.register(kv, name="kv")
names = naming.Naming(sys.argv[1], ttl_ms=2000, timeout_ms=1000)
names.publish("decode-3", eng)
print("ready", flush=True)
sys.stdin.read()
"""


def _freeze(pid):
    """SIGSTOP pid and wait (up to 5 s) until every thread of it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(st == "T" for st in states):
            return
        time.sleep(0.01)
    raise AssertionError("the publisher did not stop")


def test_open_segment_fails_fast_when_its_publisher_hangs(store):
    """A publisher SIGSTOPped (its sockets stay open: no transport notices) while a READ to
    it is in flight with a 120 s deadline: its lease ends, the segment's guard sees the
    name gone, and the READ raises PeerLostError long before its deadline; later ones at
    once."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(orbitte.__file__)))
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, store], cwd=here,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        with orbitte.Engine({"listen_address": "127.0.0.1:0", "transports": "tcp",
                             "transfer_timeout_ms": 120000}) as eng, \
                naming.Naming(store, watch_period_ms=100) as names:
            seg = names.open_segment(eng, "decode-3")
            kv = seg.buffer("kv").address
            got = np.zeros(1 << 20, np.uint8)
            eng.read(seg, got, kv)
            assert got[0] == 0x33
            _freeze(proc.pid)
            t0 = time.monotonic()
            with pytest.raises(orbitte.PeerLostError):
                eng.read(seg, got, kv)
            assert time.monotonic() - t0 < 60, "it ended at its deadline, not by the guard"
            with pytest.raises(orbitte.PeerLostError):
                eng.read(seg, got, kv)
            seg.close()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_segment_invalidate(store, engine):
    """Segment.invalidate() on a live peer: its reads fail PeerLostError at once; a new
    segment by name works."""
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as target, \
            naming.Naming(store) as names:
        kv = np.full(4096, 7, np.uint8)
        reg = target.register(kv, name="kv")
        names.publish("decode-5", target)
        seg = names.open_segment(engine, "decode-5")
        got = np.zeros(4096, np.uint8)
        addr = seg.buffer("kv").address
        seg.invalidate()
        with pytest.raises(orbitte.PeerLostError):
            engine.read(seg, got, addr)
        seg.close()
        with names.open_segment(engine, "decode-5") as seg2:
            engine.read(seg2, got, addr)
        assert np.array_equal(got, kv)
        names.unpublish("decode-5")
        reg.unregister()
