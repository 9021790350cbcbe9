"""Shared allocations (Engine.alloc_shared): host memory a same-host peer maps; over shm the
peer copies requests on it through its own mapping. Every byte checked against a peer
process."""

import numpy as np
import pytest

import orbitte
from conftest import digest, pattern


def test_shared_memory_is_a_local_buffer_both_ways(engine, peer):
    with engine.alloc_shared(peer.size + 4096) as shm:
        assert shm.length == peer.size + 4096
        arr = np.frombuffer(shm.view, np.uint8)
        assert not arr.any()  # zeroed
        src = pattern(peer.size, 21)
        arr[:peer.size] = src
        seg = engine.open_segment(peer.address)
        assert seg.transport == "shm"
        engine.write(seg, arr[:peer.size], peer.rw)
        assert peer.ask("digest")["digest"] == digest(src)
        arr[:] = 0
        engine.read(seg, arr[3:3 + peer.size], peer.rw)
        assert np.array_equal(arr[3:3 + peer.size], src)
        assert arr[2] == 0 and arr[3 + peer.size] == 0
        seg.close()
        del arr  # never used after free: the memory is unmapped


def test_free_refuses_while_registered_or_exported_and_frees_nothing(engine):
    shm = engine.alloc_shared(8192)
    shm.view[0] = 0x5A
    reg = engine.register(shm.view, perms=orbitte.PERM_READ)  # holds an export of the view
    with pytest.raises(BufferError):
        shm.free()
    reg.unregister()
    reg = engine.register(shm.address, 8192, perms=orbitte.PERM_READ)  # by address
    with pytest.raises(orbitte.BusyError):  # the engine refuses
        shm.free()
    assert shm.view[0] == 0x5A  # still allocated, the view usable again
    reg.unregister()
    shm.free()
    with pytest.raises(ValueError):
        shm.view[0]  # released: no access to unmapped memory
    with pytest.raises(ValueError):
        shm.free()  # already freed
    with pytest.raises(orbitte.InvalidError):
        engine.alloc_shared(0)


def test_engine_close_frees_what_is_left():
    eng = orbitte.Engine({"listen_address": "127.0.0.1:0"})
    shm = eng.alloc_shared(1 << 20)
    shm.view[100] = 1
    eng.close()
    assert eng.closed
    with pytest.raises(ValueError):
        shm.view[100]
