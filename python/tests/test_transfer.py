"""Two Python processes moving numpy arrays, every byte checked."""

import ctypes

import numpy as np
import pytest

import orbitte
from conftest import digest, pattern


def test_write_numpy_array_lands_byte_for_byte(engine, peer):
    src = pattern(peer.size, 7)
    engine.write(peer.address, src, peer.rw)
    assert peer.ask("digest")["digest"] == digest(src)


def test_read_numpy_array_matches_the_peers_bytes(engine, peer):
    dst = np.zeros(peer.size, np.uint8)
    engine.read(peer.address, dst, peer.rw)
    assert np.array_equal(dst, pattern(peer.size, 1))
    engine.read(peer.address, dst, peer.ro)  # READ-only registration: READ allowed
    assert np.array_equal(dst, pattern(peer.size, 2))


def test_batch_of_unaligned_pieces_with_other_buffer_types(engine, peer):
    """A batch of WRITEs at odd offsets and lengths from numpy slices, a bytearray and a
    memoryview; the peer's whole array must equal the local model of it."""
    expected = pattern(peer.size, 1)
    pieces = [(3, 1000), (4099, 65537), (300001, 17), (peer.size - 11, 11)]
    srcs = [pattern(n, 100 + i) for i, (_, n) in enumerate(pieces)]
    locals_ = [srcs[0], bytearray(srcs[1].tobytes()), memoryview(srcs[2].tobytes()), srcs[3]]
    with engine.batch(len(pieces)) as b:
        idx = b.submit([(orbitte.WRITE, lo, peer.address, peer.rw + off)
                        for lo, (off, _) in zip(locals_, pieces)])
        assert idx == [0, 1, 2, 3]
        b.wait(timeout=60)
        for i, (_, n) in enumerate(pieces):
            st = b.status(i)
            assert (st.state, st.bytes_done, st.error) == ("COMPLETED", n, None)
    for (off, n), s in zip(pieces, srcs):
        expected[off:off + n] = s
    assert peer.ask("digest")["digest"] == digest(expected)
    # READ them back into a float64 view of a buffer (byte counts, not element counts)
    back = np.zeros(peer.size // 8, np.float64)
    engine.read(peer.address, back, peer.rw)
    assert back.tobytes() == expected.tobytes()


def test_mooncake_style_sync_calls(engine, peer):
    a, b = pattern(4096, 11), pattern(8192, 12)
    assert engine.batch_transfer_sync_write(peer.address, [a, b], [peer.rw, peer.rw + 4096],
                                            [4096, 8192]) == 0
    out = np.zeros(4096 + 8192, np.uint8)
    assert engine.transfer_sync_read(peer.address, out.ctypes.data, peer.rw, out.nbytes) == 0
    assert np.array_equal(out, np.concatenate([a, b]))
    half = np.zeros(4096, np.uint8)
    assert engine.batch_transfer_sync_read(peer.address, [half], [peer.rw], [4096]) == 0
    assert np.array_equal(half, a)


def test_raw_address_and_data_ptr_objects(engine, peer):
    """Registration and transfers by raw address (a torch tensor's data_ptr()), here
    over ctypes memory and an object shaped like a tensor."""
    raw = (ctypes.c_uint8 * 65536)()
    ctypes.memmove(raw, pattern(65536, 21).tobytes(), 65536)

    class TensorLike:  # the three methods of torch.Tensor the binding uses
        def data_ptr(self):
            return ctypes.addressof(raw)

        def element_size(self):
            return 4

        def numel(self):
            return 65536 // 4

    t = TensorLike()
    reg = engine.register(t)
    assert (reg.address, reg.length) == (ctypes.addressof(raw), 65536)
    engine.write(peer.address, t, peer.rw)
    assert peer.ask("digest")["digest"] == digest(
        np.concatenate([pattern(65536, 21), pattern(peer.size, 1)[65536:]]))
    reg.unregister()
    reg2 = engine.register(ctypes.addressof(raw), 4096, perms=orbitte.PERM_READ, name="raw")
    assert reg2.name == "raw" and reg2 in engine.registrations
    engine.read(peer.address, np.uint64(ctypes.addressof(raw)), peer.ro, 4096)  # numpy int
    assert bytes(raw[:4096]) == pattern(peer.size, 2)[:4096].tobytes()


def test_peer_process_writes_and_reads_this_processes_registration(engine, peer):
    """The other direction: the peer process WRITEs into our registered array and READs
    it back; a READ-only registration of ours refuses its WRITE."""
    mine = np.zeros(1 << 16, np.uint8)
    reg = engine.register(mine)
    ans = peer.ask("write %s %d %d 9" % (engine.address, reg.address + 100, 5000))
    assert ans.get("ok"), ans
    expected = np.zeros(1 << 16, np.uint8)
    expected[100:5100] = pattern(5000, 9)
    assert np.array_equal(mine, expected)
    assert peer.ask("read %s %d %d 0" % (engine.address, reg.address, 1 << 16))["digest"] == \
        digest(expected)
    ro = bytes(4096)  # an immutable object can be registered READ-only
    reg_ro = engine.register(ro, perms=orbitte.PERM_READ)
    ans = peer.ask("write %s %d 16 1" % (engine.address, reg_ro.address))
    assert ans == {"error": "OTE_ERR_ACCESS"}
    assert ro == bytes(4096)
    assert peer.quit() == 0


def test_segment_names_the_transport_the_router_chose(peer):
    # The default list is "shm,tcp": a peer on this host is reached over shm.
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as eng:
        with eng.open_segment(peer.address) as seg:
            assert seg.transport == "shm"
    with orbitte.Engine({"listen_address": "127.0.0.1:0", "transports": "tcp"}) as eng:
        with eng.open_segment(peer.address) as seg:
            assert seg.transport == "tcp"
            dst = np.zeros(4096, np.uint8)
            eng.read(peer.address, dst, peer.rw)
            assert np.array_equal(dst, pattern(peer.size, 1)[:4096])
