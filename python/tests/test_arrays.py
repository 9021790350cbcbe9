"""Batch.submit_arrays (ote_batch_submit_v): requests given as numpy uint64 arrays (or
lists), no Python loop per request; and register's refusal of a non-contiguous tensor."""

import numpy as np
import pytest

import orbitte
from conftest import pattern

BLOCK = 4096


def test_submit_arrays_scatters_and_gathers(engine, make_peer):
    """2,048 blocks WRITTEN from a local array to a shuffled order of the peer's blocks,
    READ back the same way into another array: every byte where it belongs."""
    n = 2048
    peer = make_peer(n * BLOCK)
    src = pattern(n * BLOCK, 21)
    back = np.zeros(n * BLOCK, np.uint8)
    engine.register(src)
    engine.register(back)
    order = np.random.default_rng(4).permutation(n).astype(np.uint64)
    local = src.ctypes.data + np.arange(n, dtype=np.uint64) * BLOCK
    remote = np.uint64(peer.rw) + order * np.uint64(BLOCK)
    lengths = np.full(n, BLOCK, np.uint64)
    with engine.batch(n) as b:
        idx = b.submit_arrays(orbitte.WRITE, peer.address, local, remote, lengths)
        assert list(idx) == list(range(n))
        b.wait(60)
        b.reset()
        into = back.ctypes.data + np.arange(n, dtype=np.uint64) * BLOCK
        b.submit_arrays(orbitte.READ, peer.address, into, remote, lengths)
        b.wait(60)
        assert b.status(n - 1).bytes_done == BLOCK
    assert np.array_equal(back, src)
    # The peer holds block i of src at block order[i].
    got = np.zeros(n * BLOCK, np.uint8)
    engine.register(got)
    engine.read(peer.address, got, peer.rw)
    assert np.array_equal(got.reshape(n, BLOCK)[order.astype(np.int64)], src.reshape(n, BLOCK))


def test_submit_arrays_takes_lists_and_refuses_bad_input(engine, peer):
    src = pattern(3 * BLOCK, 2)
    engine.register(src)
    a = src.ctypes.data
    with engine.batch(3) as b:
        with pytest.raises(ValueError):
            b.submit_arrays(orbitte.WRITE, peer.address, [a], [peer.rw, peer.rw], [BLOCK])
        with pytest.raises(ValueError):
            b.submit_arrays(7, peer.address, [a], [peer.rw], [BLOCK])
        with pytest.raises(orbitte.TooBigError):
            b.submit_arrays(orbitte.WRITE, peer.address, [a] * 4, [peer.rw] * 4, [1] * 4)
        with pytest.raises(orbitte.InvalidError):  # past the end of the address space
            b.submit_arrays(orbitte.WRITE, peer.address, [a], [2**64 - 10], [BLOCK])
        assert len(b) == 0
        b.submit_arrays(orbitte.WRITE, peer.address, [a, a + BLOCK, a + 2 * BLOCK],
                        [peer.rw + 2 * BLOCK, peer.rw + BLOCK, peer.rw], [BLOCK] * 3)
        b.wait(60)
    back = np.zeros(3 * BLOCK, np.uint8)
    engine.register(back)
    engine.read(peer.address, back, peer.rw)
    assert np.array_equal(back.reshape(3, BLOCK)[::-1], src.reshape(3, BLOCK))


class _StridedTensor:
    """What register() sees of a torch tensor view with strides (no torch here)."""

    def __init__(self, base):
        self._base = base

    def data_ptr(self):
        return self._base.ctypes.data

    def element_size(self):
        return 1

    def numel(self):
        return self._base.nbytes // 2

    def is_contiguous(self):
        return False


def test_register_refuses_a_non_contiguous_tensor(engine):
    base = np.zeros(1 << 16, np.uint8)
    with pytest.raises(ValueError, match="not contiguous"):
        engine.register(_StridedTensor(base))
    assert engine.registrations == []
