"""Notifications: sent directly, and attached to a batch (only after its data landed)."""

import numpy as np

import orbitte
from conftest import digest, pattern


def test_batch_notification_arrives_after_the_data(engine, make_peer):
    peer = make_peer(8 << 20)
    for i in range(5):
        src = pattern(8 << 20, 50 + i)
        # the peer starts waiting first; its digest is taken right after it receives
        peer.proc.stdin.write("recvdigest 60\n")
        peer.proc.stdin.flush()
        engine.write(peer.address, src, peer.rw, notify=b"chunk %d" % i)
        ans = peer._answer()
        assert bytes.fromhex(ans["message"]) == b"chunk %d" % i
        assert ans["sender"] == engine.address
        assert ans["digest"] == digest(src)  # all the data was there at the notification
    assert peer.quit() == 0


def test_notification_of_a_failed_batch_is_not_sent(engine, peer):
    with engine.batch(1) as b:
        b.submit([(orbitte.WRITE, np.ones(64, np.uint8), peer.address, peer.ro)])
        b.notify(peer.address, b"must not arrive")
        try:
            b.wait(60)
            raise AssertionError("a WRITE into a READ-only registration succeeded")
        except orbitte.AccessError:
            pass
        assert isinstance(b.notify_result(), orbitte.CanceledError)  # not sent, and said so
    with engine.batch(1) as b:
        b.submit([(orbitte.WRITE, np.ones(64, np.uint8), peer.address, peer.rw)])
        b.notify(peer.address, b"delivered")
        b.wait(60)
        assert b.notify_result() is None  # acknowledged by the peer before wait returned
    assert bytes.fromhex(peer.ask("recv 60")["message"]) == b"delivered"
    engine.notify_send(peer.address, b"after")  # ordered behind anything sent before
    assert bytes.fromhex(peer.ask("recv 60")["message"]) == b"after"


def test_notify_send_both_ways_and_limits(engine, peer):
    engine.notify_send(peer.address, b"\x00binary\xff")
    ans = peer.ask("recv 60")
    assert bytes.fromhex(ans["message"]) == b"\x00binary\xff"
    assert peer.ask("send %s %s" % (engine.address, b"pong".hex())) == {"ok": True}
    n = engine.notify_recv(timeout=60)
    assert n.message == b"pong" and n.sender == peer.address
    assert engine.notify_recv(timeout=0.05) is None
    big = bytes(orbitte.NOTIFY_MAX + 1)
    try:
        engine.notify_send(peer.address, big)
        raise AssertionError("an oversized notification was accepted")
    except orbitte.RequestError as e:
        assert e.name in ("OTE_ERR_TOO_BIG", "OTE_ERR_INVALID")
    engine.notify_send(peer.address, bytes(orbitte.NOTIFY_MAX))  # the limit itself is fine
    assert len(bytes.fromhex(peer.ask("recv 60")["message"])) == orbitte.NOTIFY_MAX


def test_notify_drain_takes_every_queued_message_in_order(engine, peer):
    for i in range(3):
        assert "error" not in peer.ask("send %s %s" % (engine.address, (b"m%d" % i).hex()))
    got = engine.notify_drain()
    assert [n.message for n in got] == [b"m0", b"m1", b"m2"]
    assert all(n.sender == peer.address for n in got)
    assert engine.notify_drain() == []


def test_notifications_carry_the_senders_engine_name():
    """engine_name (issue 27): a named sender's notifications arrive with its name
    (Notification.name), an unnamed one's with "", by notify_recv and notify_drain."""
    cfg = {"listen_address": "127.0.0.1:0", "transports": "tcp"}
    with orbitte.Engine(cfg) as rx, \
            orbitte.Engine(dict(cfg, engine_name="prefill-0")) as named, \
            orbitte.Engine(cfg) as plain:
        named.notify_send(rx.address, b"one")
        n = rx.notify_recv(10)
        assert (n.message, n.sender, n.name) == (b"one", named.address, "prefill-0")
        plain.notify_send(rx.address, b"two")
        n = rx.notify_recv(10)
        assert (n.message, n.sender, n.name) == (b"two", plain.address, "")
        named.notify_send(rx.address, b"three")
        plain.notify_send(rx.address, b"four")
        got = rx.notify_drain()
        assert [(x.message, x.name) for x in got] == [(b"three", "prefill-0"), (b"four", "")]
        assert orbitte.Notification(b"m", "h:1") == (b"m", "h:1", "")  # name defaults to ""
