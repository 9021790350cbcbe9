"""Metadata blobs (ote_engine_metadata): handed over a side channel, they give the peer's
registrations without asking it and open a segment to exactly that incarnation."""

import numpy as np
import pytest

import orbitte
from conftest import pattern


def test_metadata_blob_carries_the_engine_name(engine):
    """engine_name in the blob: orbitte.metadata_name gives it, "" for an unnamed engine."""
    assert orbitte.metadata_name(engine.metadata()) == ""
    with orbitte.Engine({"listen_address": "127.0.0.1:0", "engine_name": "prefill-1"}) as t:
        blob = t.metadata()
        assert orbitte.metadata_name(blob) == "prefill-1"
        assert orbitte.metadata_buffers(blob) == []
        with pytest.raises(orbitte.ProtocolError):
            orbitte.metadata_name(blob[:-1])


def test_metadata_blob_lists_buffers_and_opens_a_segment(engine):
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as target:
        kv = np.zeros(1 << 16, np.uint8)
        target.register(kv, name="kv/0")
        blob = target.metadata()
        bufs = orbitte.metadata_buffers(blob)
        assert [b.name for b in bufs] == ["kv/0"] and bufs[0].address == kv.ctypes.data
        seg = engine.open_segment_md(blob)
        assert seg.peer == target.address
        assert seg.buffers() == bufs
        src = pattern(4096, 3)
        engine.write(seg, src, bufs[0].address + 64)
        assert np.array_equal(kv[64:64 + 4096], src)
        seg.close()
    with pytest.raises(orbitte.ProtocolError):
        orbitte.metadata_buffers(blob[:-1])
    with pytest.raises(orbitte.ProtocolError):
        engine.open_segment_md(b"OTMD" + blob[4:-1])
