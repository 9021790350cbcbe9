"""Buffer discovery: a peer process registers named arrays, this process lists them with
Segment.buffers(), transfers into one found by name (byte checks), sees one that was
unregistered disappear on the next call, and has its stale address refused."""

import numpy as np
import pytest

import orbitte
from conftest import digest, pattern


def by_name(buffers):
    return {b.name: b for b in buffers}


def test_discover_write_by_name_and_see_removal(engine, peer):
    seg = engine.open_segment(peer.address)
    bufs = by_name(seg.buffers())
    assert set(bufs) == {"rw", "ro"}
    rw, ro = bufs["rw"], bufs["ro"]
    assert isinstance(rw, orbitte.BufferInfo)
    assert (rw.address, rw.length, rw.perms, rw.kind) == (
        peer.rw, peer.size, orbitte.PERM_RW, orbitte.MEM_HOST)
    assert (ro.address, ro.length, ro.perms) == (peer.ro, peer.size, orbitte.PERM_READ)

    # a buffer registered after the segment opened is seen by the next call
    kv_addr = peer.ask("reg kv 7")["address"]
    kv = seg.buffer("kv")
    assert kv.address == kv_addr and kv.length == peer.size and kv.perms == orbitte.PERM_RW
    src = pattern(peer.size, 11)
    engine.write(seg, src, kv.address)
    assert peer.ask("digestof kv")["digest"] == digest(src)
    dst = np.zeros(peer.size, np.uint8)
    engine.read(seg, dst, seg.buffer("ro").address)
    assert digest(dst) == digest(pattern(peer.size, 2))

    # unregistered: gone from the next list, and its stale address touches nothing
    assert peer.ask("unreg kv") == {"ok": True}
    assert "kv" not in by_name(seg.buffers())
    with pytest.raises(KeyError):
        seg.buffer("kv")
    with pytest.raises(orbitte.AccessError):
        engine.write(seg, pattern(peer.size, 12), kv.address)
    assert peer.ask("digestof rw")["digest"] == digest(pattern(peer.size, 1))
    # the name is free again at the peer
    assert peer.ask("reg kv 8")["address"] > 0
    assert "kv" in by_name(seg.buffers())
    assert peer.quit() == 0


def test_names_are_checked_and_unique(engine):
    a, b = bytearray(4096), bytearray(4096)
    reg = engine.register(a, name="kv/0")
    assert reg.name == "kv/0"
    with pytest.raises(orbitte.ExistsError):
        engine.register(b, name="kv/0")
    for bad in ("", "x" * 64, "tab\there", "caf\u00e9"):
        with pytest.raises(orbitte.InvalidError):
            engine.register(b, name=bad)
    reg.unregister()
    engine.register(b, name="kv/0")  # unregistering freed the name
    engine.register(a)  # and unnamed registrations are still fine


def test_buffers_of_a_killed_peer_raise(engine, peer):
    seg = engine.open_segment(peer.address)
    assert len(seg.buffers()) == 2
    peer.kill()
    with pytest.raises((orbitte.ConnectError, orbitte.PeerLostError, orbitte.TimeoutError_)):
        seg.buffers()
