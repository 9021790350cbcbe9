"""Engine.nic_stats(): the data devices of an engine and the bytes each carried."""

import numpy as np

import orbitte


def test_tcp_engine_has_no_nics():
    with orbitte.Engine({"transports": "tcp"}) as e:
        assert e.nic_stats() == []


def test_rdma_over_the_sim_spreads_one_write_over_both_nics():
    cfg = {"transport": "rdma", "verbs_provider": "sim"}
    with orbitte.Engine(cfg) as target, orbitte.Engine(cfg) as eng:
        dst = np.zeros(8 << 20, np.uint8)
        reg = target.register(dst)
        src = np.random.randint(0, 256, 8 << 20, dtype=np.uint8)
        eng.write(target.address, src, reg.address)
        assert (dst == src).all()
        nics = eng.nic_stats()
        assert [n.name for n in nics] == ["sim0", "sim1"]
        assert all(n.transport == "rdma" and n.active for n in nics)
        assert sum(n.bytes_out for n in nics) == 8 << 20
        assert all(n.bytes_out > 0 for n in nics)
        # one request: at most one grant round trip on each device it used
        assert all(n.grants == 1 for n in nics)
        assert sum(n.bytes_served for n in target.nic_stats()) == 8 << 20
