"""Cancel, batch reuse, and closing everything with requests still pending."""

import signal
import threading

import numpy as np
import pytest

import orbitte
from conftest import digest, pattern


def test_cancel_pending_requests(engine, make_peer):
    peer = make_peer(32 << 20)
    big = np.full(32 << 20, 3, np.uint8)
    engine.session(peer.address)  # connected before it stops answering
    peer.stop()  # nothing can complete before the cancel
    with engine.batch(4) as b:
        b.submit([(orbitte.WRITE, big, peer.address, peer.rw)] * 4)
        assert [s.state for s in b.statuses()] == ["PENDING"] * 4
        with pytest.raises(orbitte.TimeoutError_):  # still pending: the wait's own deadline
            b.wait(timeout=0.2)
        with pytest.raises(orbitte.BusyError):
            b.reset()
        b.cancel()
        peer.signal(signal.SIGCONT)  # in-flight slices end, then the requests report
        with pytest.raises(orbitte.CanceledError) as info:
            b.wait(timeout=60)
        # a request whose slices were all in flight at the cancel may still complete;
        # the others report CANCELED, and the exception lists exactly those
        states = [s.state for s in b.statuses()]
        assert set(states) <= {"COMPLETED", "CANCELED"} and "CANCELED" in states, states
        assert info.value.name == "OTE_ERR_CANCELED"
        assert info.value.failed == [i for i, st in enumerate(states) if st == "CANCELED"]
        for st in b.statuses():
            assert st.error is None or isinstance(st.error, orbitte.CanceledError)
        b.reset()  # reusable after the cancel
        assert len(b) == 0
        src = pattern(1 << 20, 8)
        b.submit([(orbitte.WRITE, src, peer.address, peer.rw)])
        b.wait(60)
    data = np.zeros(32 << 20, np.uint8)
    engine.read(peer.address, data, peer.rw)
    assert np.array_equal(data[:1 << 20], src)  # the later write landed
    # bytes past the cancelled writes' extent were never touched; within it, each byte
    # is either the old pattern or the cancelled data, nothing else
    old = pattern(32 << 20, 1)
    rest = data[1 << 20:]
    assert np.all((rest == old[1 << 20:]) | (rest == 3))
    assert peer.quit() == 0


def test_context_manager_closes_everything(make_peer):
    peer = make_peer(32 << 20)
    big = np.full(32 << 20, 1, np.uint8)
    with orbitte.Engine() as eng:
        regs = [eng.register(np.zeros(4096, np.uint8)), eng.register(bytearray(4096))]
        seg = eng.open_segment(peer.address)
        done = eng.batch(1)
        done.submit([(orbitte.WRITE, big[:4096], seg, peer.rw)])
        done.wait(60)
        eng.session(peer.address)
        peer.stop()
        pending = eng.batch(1)
        pending.submit([(orbitte.WRITE, big, seg, peer.rw)])
        # close() cancels `pending`, whose in-flight slices end once the peer runs again
        threading.Timer(0.5, peer.signal, (signal.SIGCONT,)).start()
    assert eng.closed and not eng.registrations
    for closed in (seg, done, pending):
        with pytest.raises(orbitte.StateError):
            closed.handle
    regs[1].obj.extend(b"x")  # the bytearray's export was released
    assert peer.ask("digest")["digest"] != digest(pattern(32 << 20, 1))
    assert peer.quit() == 0
