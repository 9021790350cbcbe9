"""Many Python threads submitting at once on one engine, and the GIL released in waits."""

import threading

import numpy as np

import orbitte
from conftest import digest, pattern

THREADS = 8
ROUNDS = 40
PIECE = 64 << 10


def test_many_threads_submit_at_once(engine, make_peer):
    """Eight threads, each on its own slice of the peer's array and its own batch or the
    convenience calls, WRITE then READ back and compare, all at the same time."""
    peer = make_peer(THREADS * PIECE)
    seg = engine.open_segment(peer.address)
    start = threading.Barrier(THREADS)
    errors = []
    final = {}

    def worker(t):
        try:
            base = peer.rw + t * PIECE
            back = np.zeros(PIECE, np.uint8)
            start.wait(60)
            with engine.batch(2) as b:
                for r in range(ROUNDS):
                    src = pattern(PIECE, 1000 * t + r)
                    if r % 2:
                        engine.write(peer.address, src, base)  # the shared session segment
                        engine.read(peer.address, back, base)
                    else:
                        b.submit([(orbitte.WRITE, src, seg, base)])
                        b.wait(60)
                        b.submit([(orbitte.READ, back, seg, base)])
                        b.wait(60)
                        b.reset()
                    if not np.array_equal(back, src):
                        errors.append("thread %d round %d: wrong bytes" % (t, r))
                        return
            final[t] = src
        except Exception as e:  # reported below with the thread's number
            errors.append("thread %d: %r" % (t, e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
        assert not th.is_alive(), "a worker thread did not finish within 300 s"
    assert errors == []
    expected = np.concatenate([final[t] for t in range(THREADS)])
    assert peer.ask("digest")["digest"] == digest(expected)
    assert peer.quit() == 0


def test_the_gil_is_released_while_waiting(engine):
    """A thread blocked in notify_recv (a wait in C with a deadline) lets the main thread
    run Python meanwhile: with the GIL held, the main loop could not count at all until
    the wait returned."""
    inside = threading.Event()
    result = []

    def waiter():
        inside.set()
        result.append(engine.notify_recv(timeout=2.0))

    th = threading.Thread(target=waiter)
    th.start()
    inside.wait(60)
    count = 0
    while th.is_alive():
        count += 1
    th.join()
    assert result == [None]  # no message: the wait ran out
    assert count > 10000, count
