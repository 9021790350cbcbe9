"""orbitte.mooncake's *_on_cuda calls without a GPU: Mooncake's contract is that the
transfer starts after the work queued on the stream before the call and that the stream's
later work follows the transfer (Mooncake enqueues a host callback with
cudaLaunchHostFunc, mooncake-integration/transfer_engine/transfer_engine_py.cpp,
batchTransferOnCuda). OrbitTE synchronizes the stream, then transfers, then returns: a
fake stream whose synchronize() plays the kernel that produces (or must see) the bytes
shows the order; an integer stream_ptr goes through torch (a fake torch module here) or
cuda-python, and with neither the call raises before moving anything."""

import sys
import types

import numpy as np
import pytest

from orbitte import mooncake
from conftest import pattern

HOST = "127.0.0.1"
N = 64 << 10


def new_engine():
    te = mooncake.TransferEngine()
    assert te.initialize(HOST, mooncake.P2PHANDSHAKE, "tcp", "") == 0
    return te


@pytest.fixture
def pair():
    decode, prefill = new_engine(), new_engine()
    yield decode, prefill
    prefill.close()
    decode.close()


def addr(a):
    return a.ctypes.data


def session(te):
    return "%s:%d" % (HOST, te.get_rpc_port())


class KernelStream:
    """A stream whose queued "kernel" writes `fill` into `buf` when it is synchronized,
    recording what `watch` held at that moment."""

    def __init__(self, buf, fill, watch):
        self.buf, self.fill, self.watch = buf, fill, watch
        self.seen = []

    def synchronize(self):
        self.seen.append(self.watch.copy())
        if self.buf is not None:
            self.buf[:] = self.fill


def test_write_on_cuda_sends_what_the_streams_work_produced(pair):
    decode, prefill = pair
    dst, src = np.zeros(N, np.uint8), np.zeros(N, np.uint8)
    want = pattern(N, 21)
    assert decode.register_memory(addr(dst), N) == 0
    assert prefill.register_memory(addr(src), N) == 0
    stream = KernelStream(src, want, dst)
    assert prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst), N, stream) is None
    assert len(stream.seen) == 1 and not stream.seen[0].any()  # nothing moved before the sync
    assert np.array_equal(dst, want)  # the bytes the stream's work wrote, moved after it
    # The batch form, two halves.
    want2 = pattern(N, 22)
    stream = KernelStream(src, want2, dst)
    h = N // 2
    prefill.batch_transfer_write_on_cuda(session(decode), [addr(src), addr(src) + h],
                                         [addr(dst), addr(dst) + h], [h, h], stream)
    assert np.array_equal(stream.seen[0], want) and np.array_equal(dst, want2)


def test_read_on_cuda_lands_before_the_call_returns(pair):
    decode, prefill = pair
    remote = pattern(N, 23)
    local = np.zeros(N, np.uint8)
    assert decode.register_memory(addr(remote), N) == 0
    assert prefill.register_memory(addr(local), N) == 0
    stream = KernelStream(None, None, local)
    prefill.transfer_read_on_cuda(session(decode), addr(local), addr(remote), N, stream)
    assert not stream.seen[0].any() and np.array_equal(local, remote)
    local[:] = 0
    h = N // 2
    prefill.batch_transfer_read_on_cuda(session(decode), [addr(local), addr(local) + h],
                                        [addr(remote), addr(remote) + h], [h, h], stream)
    assert np.array_equal(local, remote)  # the stream's later work would see it


def test_integer_stream_goes_through_torch(pair, monkeypatch):
    """stream_ptr is a cudaStream_t as an integer (Mooncake's type): torch's ExternalStream
    wraps it, 0 is torch's default stream (the legacy default stream)."""
    decode, prefill = pair
    dst, src = np.zeros(N, np.uint8), pattern(N, 24)
    assert decode.register_memory(addr(dst), N) == 0
    assert prefill.register_memory(addr(src), N) == 0
    synced = []

    class Stream:
        def __init__(self, handle):
            self.handle = handle

        def synchronize(self):
            synced.append((self.handle, dst.any()))

    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: True, ExternalStream=Stream,
                                      default_stream=lambda: Stream(0))
    monkeypatch.setitem(sys.modules, "torch", fake)
    prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst), N, 0x7f00beef)
    prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst), N)  # stream 0
    assert synced == [(0x7f00beef, False), (0, True)]
    assert np.array_equal(dst, src)


def test_without_a_way_to_the_stream_or_with_bad_lists_nothing_moves(pair, monkeypatch):
    decode, prefill = pair
    dst, src = np.zeros(N, np.uint8), pattern(N, 25)
    assert decode.register_memory(addr(dst), N) == 0
    assert prefill.register_memory(addr(src), N) == 0
    no_cuda = types.ModuleType("torch")
    no_cuda.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", no_cuda)
    monkeypatch.setattr(mooncake, "_cuda_runtime", lambda: None)
    with pytest.raises(RuntimeError, match="neither torch .with CUDA. nor cuda-python"):
        prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst), N, 0x1234)
    with pytest.raises(RuntimeError, match="stream_ptr must be"):
        prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst), N, "s")
    stream = KernelStream(None, None, dst)
    with pytest.raises(RuntimeError, match="different size"):
        prefill.batch_transfer_write_on_cuda(session(decode), [addr(src)], [addr(dst)], [N, N],
                                             stream)
    assert stream.seen == []  # checked before the stream is waited for
    assert not dst.any()
    # A transfer that fails (an unregistered remote range) raises after the sync.
    with pytest.raises(RuntimeError, match="transfer_write_on_cuda to .*failed"):
        prefill.transfer_write_on_cuda(session(decode), addr(src), addr(dst) + N, N, stream)
    assert len(stream.seen) == 1
