"""Statuses as exceptions: the class hierarchy by scope, and the errors a user meets."""

import os
import socket

import numpy as np
import pytest

import orbitte
from conftest import pattern
from orbitte import engine as eng_mod


def test_every_code_maps_to_the_librarys_name_and_scope():
    lib = eng_mod.lib
    scope_base = {1: orbitte.RequestError, 2: orbitte.PeerError, 3: orbitte.DeviceError}
    for code, cls in orbitte.ERROR_CLASSES.items():
        assert lib.ote_status_str(code).decode() == orbitte.errors.CODES[code][0]
        assert issubclass(cls, scope_base[lib.ote_status_scope(code)])
        e = cls(code)
        assert e.name == lib.ote_status_str(code).decode() and e.code == code
    # a status with an errno: the code's class, the errno kept, the library's description
    st = (12 << 16) | 200
    e = orbitte.error_class(st)(st, "x", eng_mod.describe(st))
    assert isinstance(e, orbitte.NativeError) and isinstance(e, orbitte.DeviceError)
    assert (e.code, e.errno, e.name) == (200, 12, "OTE_ERR_NATIVE")
    assert issubclass(orbitte.TimeoutError_, TimeoutError)
    assert lib.ote_status_str(999).decode() not in ("", None)


@pytest.mark.parametrize("config,cls,name", [
    ({"no_such_key": "1"}, orbitte.NotFoundError, "OTE_ERR_NOT_FOUND"),
    ({"transfer_timeout_ms": "soon"}, orbitte.InvalidError, "OTE_ERR_INVALID"),
    ({"transport": "carrier-pigeon"}, orbitte.InvalidError, "OTE_ERR_INVALID"),
    ({"listen_address": "127.0.0.1:99999"}, orbitte.InvalidError, "OTE_ERR_INVALID"),
])
def test_bad_config_raises_with_the_status_name(config, cls, name):
    with pytest.raises(cls) as info:
        orbitte.Engine(config)
    assert info.value.name == name and isinstance(info.value, orbitte.RequestError)
    assert list(config)[0] in str(info.value)


def test_out_of_range_fails_the_request_and_touches_nothing(engine, peer):
    src = np.full(4096, 0xAB, np.uint8)
    before = peer.ask("digest")["digest"]
    with engine.batch(2) as b:
        b.submit([(orbitte.WRITE, src, peer.address, peer.rw + peer.size - 100),  # 100 over
                  (orbitte.WRITE, src[:16], peer.address, peer.rw)])
        with pytest.raises(orbitte.AccessError) as info:
            b.wait(60)
        assert info.value.name == "OTE_ERR_ACCESS" and info.value.failed == [0]
        st = b.status(0)
        assert st.state == "FAILED" and isinstance(st.error, orbitte.AccessError)
        assert b.status(1).state == "COMPLETED"
    assert peer.ask("digest")["digest"] != before  # the in-range request did land ...
    dst = np.zeros(peer.size, np.uint8)
    engine.read(peer.address, dst, peer.rw)
    expected = pattern(peer.size, 1)
    expected[:16] = src[:16]
    assert np.array_equal(dst, expected)  # ... and nothing else changed
    with pytest.raises(orbitte.AccessError):
        engine.read(peer.address, dst, 0x1000)  # no registration there at all


def test_wrong_permissions(engine, peer):
    with pytest.raises(orbitte.AccessError):
        engine.write(peer.address, np.ones(64, np.uint8), peer.ro)  # READ-only there
    dst = np.zeros(64, np.uint8)
    engine.read(peer.address, dst, peer.ro)
    assert np.array_equal(dst, pattern(peer.size, 2)[:64])


def test_local_buffer_errors(engine):
    with pytest.raises(BufferError):
        engine.register(b"immutable", perms=orbitte.PERM_RW)  # peers could WRITE it
    with pytest.raises(BufferError):
        engine.register(np.zeros((64, 64), np.uint8)[:, ::2])  # not contiguous
    with pytest.raises(ValueError):
        engine.register(12345)  # raw address without length
    arr = np.zeros(4096, np.uint8)
    reg = engine.register(arr)
    with pytest.raises(orbitte.ExistsError) as info:
        engine.register(arr[1024:])  # overlaps
    assert info.value.name == "OTE_ERR_EXISTS"
    reg.unregister()
    with pytest.raises(orbitte.NotFoundError):
        engine.unregister(arr.ctypes.data)
    # OTE_PERM_IPC opts device memory in to CUDA IPC: on host memory, or alone, refused
    for perms in (orbitte.PERM_READ | orbitte.PERM_IPC, orbitte.PERM_IPC):
        with pytest.raises(orbitte.InvalidError):
            engine.register(arr, perms=perms)
    engine.register(arr, perms=orbitte.PERM_READ).unregister()  # nothing left registered


def test_a_registered_bytearray_cannot_be_resized():
    with orbitte.Engine() as eng:
        ba = bytearray(4096)
        reg = eng.register(ba)
        with pytest.raises(BufferError):
            ba.extend(b"x" * 100000)  # would move the memory peers were told about
        reg.unregister()
        ba.extend(b"x")  # released at unregister
        assert len(ba) == 4097


def test_unreachable_peer_is_a_peer_error(engine):
    # bound but never listening: connections to it are refused, and while it stays bound
    # no other process (tests run in parallel) can take the port and start listening there
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(orbitte.ConnectError) as info:
            engine.open_segment("127.0.0.1:%d" % port)
    assert isinstance(info.value, orbitte.PeerError) and info.value.name == "OTE_ERR_CONNECT"
    with pytest.raises(orbitte.InvalidError):
        engine.open_segment("no port here")


def test_closed_objects_raise_state_errors(peer):
    eng = orbitte.Engine()
    seg = eng.open_segment(peer.address)
    b = eng.batch(4)
    eng.close()
    assert eng.closed
    for call in (lambda: eng.address, lambda: eng.register(bytearray(8)), lambda: b.cancel(),
                 lambda: b.submit([(orbitte.WRITE, bytearray(8), seg, peer.rw)])):
        with pytest.raises(orbitte.StateError):
            call()
    eng.close()  # closing twice is harmless
    with orbitte.Engine() as other, other.batch(1) as b:
        with pytest.raises(ValueError):
            b.submit([(7, bytearray(1), peer.address, peer.rw)])


def _key_file(tmp_path, name, seed, mode=0o600):
    path = tmp_path / name
    path.write_bytes(bytes((seed + i * 7) % 256 for i in range(32)))
    os.chmod(path, mode)
    return str(path)


def test_cluster_key_mismatch_raises_auth_error(tmp_path):
    key_a, key_b = _key_file(tmp_path, "a", 1), _key_file(tmp_path, "b", 2)
    base = {"listen_address": "127.0.0.1:0", "transports": "tcp"}
    with orbitte.Engine(dict(base, auth_key_file=key_a)) as src, \
            orbitte.Engine(dict(base, auth_key_file=key_a)) as same, \
            orbitte.Engine(dict(base, auth_key_file=key_b)) as other, \
            orbitte.Engine(base) as unkeyed:
        remote = np.zeros(4096, np.uint8)
        src.register(remote)
        data = (np.arange(4096) % 251).astype(np.uint8)
        same.write(src.address, data, remote.ctypes.data)
        assert np.array_equal(remote, data)
        for eng in (other, unkeyed):
            with pytest.raises(orbitte.AuthError) as info:
                eng.open_segment(src.address)
            assert info.value.name == "OTE_ERR_AUTH" and isinstance(info.value, orbitte.PeerError)


def test_key_file_readable_by_others_is_refused(tmp_path):
    with pytest.raises(orbitte.AccessError) as info:
        orbitte.Engine({"auth_key_file": _key_file(tmp_path, "open", 1, 0o644)})
    assert info.value.name == "OTE_ERR_ACCESS"
