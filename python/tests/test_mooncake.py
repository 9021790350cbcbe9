"""orbitte.mooncake: Mooncake's TransferEngine calls, as inference servers make them.

Each replay names the upstream file whose call sequence it mirrors (read from the public
sources, never copied): SGLang's MooncakeTransferEngine wrapper and its disaggregation
connection, vLLM's Mooncake connector worker, and Mooncake's own Python API document.
Two engines in this process play decode and prefill (protocol "tcp": shm between them,
this being one host), and every byte moved is checked.
"""

import concurrent.futures
import logging
import signal
import threading
import time

import numpy as np
import pytest

import orbitte
from orbitte import mooncake
from conftest import pattern

HOST = "127.0.0.1"
PAGE = 4096


def new_engine(protocol="tcp"):
    te = mooncake.TransferEngine()
    assert te.initialize(HOST, mooncake.P2PHANDSHAKE, protocol, "") == 0
    return te


@pytest.fixture
def pair():
    decode, prefill = new_engine(), new_engine()
    yield decode, prefill
    prefill.close()
    decode.close()


def addr(a):
    return a.ctypes.data


def session_of(te):
    # What both callers publish: host and get_rpc_port(); SGLang parses the port back
    # with rsplit(":", 1), so the name must end in ":<int>".
    sid = "%s:%d" % (HOST, te.get_rpc_port())
    assert int(sid.rsplit(":", 1)[1]) == te.get_rpc_port()
    assert sid == te.get_session_id()
    return sid


def test_sglang_prefill_pushes_pages_with_batch_writes(pair):
    """Mirrors sglang python/sglang/srt/distributed/device_communicators/
    mooncake_transfer_engine.py (initialize with P2PHANDSHAKE, session id from
    get_rpc_port, batch_register_memory of deduplicated KV buffers, batch_transfer_sync
    -> batch_transfer_sync_write, batch_unregister_memory at teardown) and
    python/sglang/srt/disaggregation/mooncake/conn.py (prefill WRITEs one entry per
    contiguous page run of every layer's K and V into decode's buffers, from a thread pool;
    0 is success, anything else fails the session)."""
    decode, prefill = pair
    layers, pages = 4, 256
    dst = [np.zeros(pages * PAGE, np.uint8) for _ in range(2 * layers)]  # K and V per layer
    src = [pattern(pages * PAGE, 10 + i) for i in range(2 * layers)]
    ptrs = [addr(a) for a in dst]
    assert decode.batch_register_memory(ptrs + ptrs[:1], [a.nbytes for a in dst] * 1 +
                                        [dst[0].nbytes]) == -7  # a duplicate overlaps
    assert decode.batch_register_memory(ptrs, [a.nbytes for a in dst]) == 0
    assert prefill.batch_register_memory([addr(a) for a in src], [a.nbytes for a in src]) == 0
    session = session_of(decode)
    # Scattered page runs: page p of the source goes to page (p * 7) % pages of the
    # destination, one entry each (no two consecutive pages form a run).
    perm = [(p * 7) % pages for p in range(pages)]

    def push(layer_pair):
        bufs, peers, lens = [], [], []
        for i in layer_pair:
            for p in range(pages):
                bufs.append(addr(src[i]) + p * PAGE)
                peers.append(addr(dst[i]) + perm[p] * PAGE)
                lens.append(PAGE)
        return prefill.batch_transfer_sync_write(session, bufs, peers, lens)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        rets = list(pool.map(push, [(2 * k, 2 * k + 1) for k in range(layers)]))
    assert rets == [0] * layers
    for i in range(2 * layers):
        got = dst[i].reshape(pages, PAGE)[perm]
        assert np.array_equal(got.reshape(-1), src[i]), "buffer %d" % i
    # Mismatched lists and a dead session: a negative value, never an exception.
    assert prefill.batch_transfer_sync_write(session, [addr(src[0])], [], [PAGE]) < 0
    dead = "%s:%d" % (HOST, 1)  # nothing listens on port 1
    assert prefill.batch_transfer_sync_write(dead, [addr(src[0])], [ptrs[0]], [PAGE]) < 0
    assert decode.batch_unregister_memory(ptrs) == 0
    assert prefill.batch_unregister_memory([addr(a) for a in src]) == 0


def test_vllm_sender_pool_writes_blocks(pair):
    """Mirrors vllm/distributed/kv_transfer/kv_connector/v1/mooncake_connector.py: the
    worker initializes with P2PHANDSHAKE and the configured protocol, publishes
    get_rpc_port(), registers its KV caches with batch_register_memory (non-zero raises
    there), and the producer's sender pool (num_workers, default 10 threads) calls
    batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs, lengths) for each
    ready request at once, with no try/except: 0 is success."""
    decode, prefill = pair
    blocks, block = 64, 16 << 10
    kv_d = np.zeros(blocks * block, np.uint8)
    kv_p = pattern(blocks * block, 3)
    assert decode.batch_register_memory([addr(kv_d)], [kv_d.nbytes]) == 0
    assert prefill.batch_register_memory([addr(kv_p)], [kv_p.nbytes]) == 0
    remote_session = "%s:%d" % (HOST, decode.get_rpc_port())
    requests = [list(range(r, blocks, 10)) for r in range(10)]  # 10 requests' blocks

    def send_blocks(ids):
        src = [addr(kv_p) + b * block for b in ids]
        dst = [addr(kv_d) + (blocks - 1 - b) * block for b in ids]  # mirrored layout
        return prefill.batch_transfer_sync_write(remote_session, src, dst, [block] * len(ids))

    with concurrent.futures.ThreadPoolExecutor(max_workers=10,
                                               thread_name_prefix="vllm-mooncake-sender") as ex:
        rets = list(ex.map(send_blocks, requests))
    assert rets == [0] * 10
    got = kv_d.reshape(blocks, block)[::-1].reshape(-1)
    assert np.array_equal(got, kv_p)


def test_reads_async_batches_and_status_polling(pair):
    """Mooncake's Python API document (docs/source/api-reference/python/
    transfer-engine.md): transfer_sync_read, batch_transfer_async_write with
    get_batch_transfer_status (blocks, frees every id, 0 when all completed), and
    transfer_submit_write polled with transfer_check_status (1 completed, 0 pending)."""
    decode, prefill = pair
    remote = pattern(1 << 20, 5)
    local = np.zeros(1 << 20, np.uint8)
    assert decode.register_memory(addr(remote), remote.nbytes) == 0
    assert prefill.register_memory(addr(local), local.nbytes) == 0
    session = session_of(decode)
    assert prefill.transfer_sync_read(session, addr(local), addr(remote), 1 << 20) == 0
    assert np.array_equal(local, remote)
    local[:] = pattern(1 << 20, 6)
    ids = [prefill.batch_transfer_async_write(session, [addr(local) + i * PAGE],
                                              [addr(remote) + i * PAGE], [PAGE])
           for i in range(16)]
    assert all(i != 0 for i in ids) and len(set(ids)) == 16
    assert prefill.get_batch_transfer_status(ids) == 0
    assert np.array_equal(remote[:16 * PAGE], local[:16 * PAGE])
    assert prefill.get_batch_transfer_status(ids) == -1  # consumed
    bid = prefill.transfer_submit_write(session, addr(local), addr(remote), 1 << 20)
    assert bid != 0
    end = time.monotonic() + 60
    st = 0
    while st == 0 and time.monotonic() < end:
        st = prefill.transfer_check_status(bid)
    assert st == 1
    assert prefill.transfer_check_status(bid) == -1  # freed at 1
    assert np.array_equal(remote, local)
    # A failed request (outside the peer's registration): -1 from the sync call, -1 from
    # the status of an async one.
    assert prefill.transfer_sync_write(session, addr(local), 4096, PAGE) == -1
    bid = prefill.transfer_submit_write(session, addr(local), 4096, PAGE)
    st = 0
    while bid != 0 and st == 0 and time.monotonic() < end:
        st = prefill.transfer_check_status(bid)
    assert bid == 0 or st == -1


def test_notify_arrives_after_the_data(pair):
    """transfer_sync(..., opcode, notify) as Mooncake's binding takes it: the peer's
    get_notifies() drains TransferNotify(name, msg) once the data is in its memory."""
    decode, prefill = pair
    dst = np.zeros(256 << 10, np.uint8)
    src = pattern(256 << 10, 9)
    assert decode.register_memory(addr(dst), dst.nbytes) == 0
    assert prefill.register_memory(addr(src), src.nbytes) == 0
    session = session_of(decode)
    note = mooncake.TransferNotify("req-7", "kv ready")
    assert prefill.transfer_sync(session, addr(src), addr(dst), src.nbytes,
                                 mooncake.TransferOpcode.Write, note) == 0
    # transfer_sync returned once the receiver acknowledged the notification: it is
    # queued there now.
    assert decode.get_notifies() == [note]
    assert np.array_equal(dst, src)  # the data was there before the notification
    assert decode.get_notifies() == []
    assert mooncake.TransferOpcode.Read == 0 and mooncake.TransferOpcode.WRITE == 1


def test_registration_conventions_and_managed_buffers(pair):
    """Mooncake's integer conventions: overlap -7, zero length -1, unknown -3; managed
    buffers (allocate 0 on failure, freed with their length), bytes in and out of them,
    and get_first_buffer_address (the peer's first buffer)."""
    decode, prefill = pair
    a = np.zeros(64 << 10, np.uint8)
    assert decode.register_memory(addr(a), a.nbytes) == 0
    assert decode.register_memory(addr(a) + 4096, 4096) == -7
    assert decode.register_memory(addr(a), 0) == -1
    assert decode.unregister_memory(addr(a) + 1) == -3
    buf = decode.allocate_managed_buffer(1 << 20)
    assert buf != 0
    assert decode.allocate_managed_buffer(0) == 0
    assert decode.write_bytes_to_buffer(buf, b"hello mooncake", 14) == 0
    assert decode.read_bytes_from_buffer(buf, 14) == b"hello mooncake"
    session = session_of(decode)
    first = prefill.get_first_buffer_address(session)
    assert first == min(addr(a), buf)
    out = np.zeros(14, np.uint8)
    assert prefill.register_memory(addr(out), out.nbytes) == 0
    assert prefill.transfer_sync_read(session, addr(out), buf, 14) == 0
    assert out.tobytes() == b"hello mooncake"
    assert decode.free_managed_buffer(buf, 1 << 19) == -1  # the wrong length
    assert decode.free_managed_buffer(buf, 1 << 20) == 0
    assert decode.unregister_memory(addr(a)) == 0
    assert prefill.get_first_buffer_address("%s:1" % HOST) == 0
    assert prefill.send_probe(session) == 0
    assert prefill.send_probe("%s:1" % HOST) == -1
    assert '"devices"' in decode.get_local_topology()


def test_initialize_conventions(caplog, monkeypatch):
    """A metadata server other than P2PHANDSHAKE, etcd:// and redis:// (http://) is
    refused (-1, logged; etcd and Redis: tests/test_naming.py); "rdma" with no
    usable RDMA device falls back to tcp with one WARN, as Mooncake does; the port in
    local_hostname is ignored; MC_TRANSFER_TIMEOUT is applied (INFO)."""
    te = mooncake.TransferEngine()
    with caplog.at_level(logging.INFO, logger="orbitte.mooncake"):
        assert te.initialize(HOST, "http://127.0.0.1:8080/metadata", "tcp", "") == -1
        assert "P2PHANDSHAKE" in caplog.text
        monkeypatch.setenv("OTE_VERBS_PROVIDER", "rdma-core")
        monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "7")
        assert te.initialize(HOST + ":12345", mooncake.P2PHANDSHAKE, "rdma", "") == 0
        assert "falling back to tcp" in caplog.text
        assert "transfer_timeout_ms=7000" in caplog.text
    assert 0 < te.get_rpc_port() < 65536
    assert te.initialize(HOST, mooncake.P2PHANDSHAKE, "tcp", "") == -1  # twice
    te.close()


def test_mc_gid_index_maps_to_rdma_gid_index(caplog, monkeypatch):
    """MC_GID_INDEX becomes rdma_gid_index (INFO); a negative one is Mooncake's "choose
    one" and leaves the engine's ranked choice; one the engine refuses fails initialize."""
    with caplog.at_level(logging.INFO, logger="orbitte.mooncake"):
        monkeypatch.setenv("MC_GID_INDEX", "3")
        assert mooncake._env_config()["rdma_gid_index"] == "3"
        assert "MC_GID_INDEX=3: rdma_gid_index=3" in caplog.text
        monkeypatch.setenv("MC_GID_INDEX", "-1")
        assert "rdma_gid_index" not in mooncake._env_config()
        assert "MC_GID_INDEX=-1: automatic GID choice" in caplog.text
        te = mooncake.TransferEngine()
        assert te.initialize(HOST, mooncake.P2PHANDSHAKE, "tcp", "") == 0
        te.close()
        monkeypatch.setenv("MC_GID_INDEX", "256")  # past a QP's 8-bit source GID index
        te = mooncake.TransferEngine()
        assert te.initialize(HOST, mooncake.P2PHANDSHAKE, "tcp", "") == -1
        te.close()


def test_install_makes_mooncake_engine_resolve_here(monkeypatch):
    import sys
    monkeypatch.delitem(sys.modules, "mooncake", raising=False)
    monkeypatch.delitem(sys.modules, "mooncake.engine", raising=False)
    assert mooncake.install()
    from mooncake.engine import TransferEngine, TransferOpcode  # noqa: F811
    assert TransferEngine is mooncake.TransferEngine
    assert TransferOpcode.Write == 1


def test_a_stopped_peer_holds_up_only_its_own_callers(make_peer, monkeypatch):
    """Ten threads on one engine (vLLM's sender pool): one opens a session to a peer
    that is SIGSTOPped (its handshake can only end at connect_timeout_ms); the nine others
    WRITE to a live peer meanwhile, and all of theirs end before the stopped peer's call
    returns: no engine-wide lock is held across the other peer's open."""
    live, stopped = make_peer(1 << 20), make_peer(1 << 20)
    # The stopped peer's handshake ends at its timeout: long enough for the others' work.
    monkeypatch.setenv("OTE_CONNECT_TIMEOUT_MS", "30000")
    monkeypatch.setenv("OTE_HANDSHAKE_TIMEOUT_MS", "30000")
    te = mooncake.TransferEngine()
    assert te.initialize(HOST, mooncake.P2PHANDSHAKE, "tcp", "") == 0
    try:
        src = pattern(1 << 20, 11)
        assert te.register_memory(addr(src), src.nbytes) == 0
        stopped.stop()
        done = {}
        blocked_started = threading.Event()

        def blocked():
            blocked_started.set()
            rc = te.transfer_sync_write(stopped.address, addr(src), stopped.rw, PAGE)
            done["blocked"] = (time.monotonic(), rc)

        def worker(t):
            blocked_started.wait(60)
            for r in range(20):
                off = (t * 20 + r) % 256 * PAGE
                assert te.transfer_sync_write(live.address, addr(src) + off, live.rw + off,
                                              PAGE) == 0
            done[t] = time.monotonic()

        threads = [threading.Thread(target=blocked)]
        threads += [threading.Thread(target=worker, args=(t,)) for t in range(9)]
        for th in threads:
            th.start()
        for th in threads[1:]:
            th.join(120)
        assert all(t in done for t in range(9)), "a live peer's transfers did not finish"
        assert "blocked" not in done, "the stopped peer's call ended before the others"
        stopped.signal(signal.SIGCONT)
        threads[0].join(120)
        assert "blocked" in done
    finally:
        te.close()


def test_get_notifies_names_plain_notifications_by_the_senders_engine_name(monkeypatch):
    """A notification framed by transfer_sync keeps the name its sender gave (Mooncake's
    NotifyDesc); a plain OrbitTE one is named by its sender's engine_name
    (OTE_ENGINE_NAME here), else by its host:port."""
    decode = new_engine()
    monkeypatch.setenv("OTE_ENGINE_NAME", "prefill-3")
    prefill = new_engine()
    monkeypatch.delenv("OTE_ENGINE_NAME")
    plain = new_engine()
    try:
        session = session_of(decode)
        prefill.get_engine().notify_send(session, b"plain named")
        plain.get_engine().notify_send(session, b"plain unnamed")
        dst = np.zeros(PAGE, np.uint8)
        src = pattern(PAGE, 4)
        assert decode.register_memory(addr(dst), dst.nbytes) == 0
        assert prefill.register_memory(addr(src), src.nbytes) == 0
        note = mooncake.TransferNotify("req-9", "kv ready")
        assert prefill.transfer_sync(session, addr(src), addr(dst), PAGE,
                                     mooncake.TransferOpcode.Write, note) == 0
        assert decode.get_notifies() == [
            mooncake.TransferNotify("prefill-3", "plain named"),
            mooncake.TransferNotify(session_of(plain), "plain unnamed"),
            note,
        ]
    finally:
        plain.close()
        prefill.close()
        decode.close()
