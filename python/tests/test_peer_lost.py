"""A peer killed in the middle of a transfer: PEER_LOST, not a hang, and the rest lives."""

import signal
import time

import numpy as np
import pytest

import orbitte
from conftest import digest, pattern


def test_killed_peer_fails_pending_requests_with_peer_lost(engine, make_peer):
    victim = make_peer(64 << 20)
    healthy = make_peer(1 << 20)
    big = np.full(64 << 20, 7, np.uint8)
    engine.session(victim.address)  # connected before it stops answering
    victim.stop()  # certainly mid-transfer when killed
    with engine.batch(2) as b:
        b.submit([(orbitte.WRITE, big, victim.address, victim.rw),
                  (orbitte.READ, big[:1 << 20], victim.address, victim.rw)])
        assert b.status(0).state == "PENDING"
        t0 = time.monotonic()
        victim.kill()
        # the engine's transfer deadline is 30 s: PEER_LOST (not TIMEOUT) within a wait
        # of 25 s shows the loss was detected, not waited out
        with pytest.raises(orbitte.PeerLostError) as info:
            b.wait(timeout=25)
        assert time.monotonic() - t0 < 25
        e = info.value
        assert isinstance(e, orbitte.PeerError) and e.name == "OTE_ERR_PEER_LOST"
        assert e.failed == [0, 1]
        for st in b.statuses():
            assert st.state == "FAILED" and st.error.name == "OTE_ERR_PEER_LOST"
        b.reset()
        # while it is gone a new submit fails at once: reconnecting is refused
        with pytest.raises(orbitte.ConnectError):
            b.submit([(orbitte.WRITE, big[:16], victim.address, victim.rw)])
    # the other peer was never affected
    src = pattern(1 << 20, 5)
    engine.write(healthy.address, src, healthy.rw)
    assert healthy.ask("digest")["digest"] == digest(src)
    assert healthy.quit() == 0
