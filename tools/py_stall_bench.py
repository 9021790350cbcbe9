"""A stopped peer must not slow the others (issue 27): nine threads of one
orbitte.mooncake.TransferEngine WRITE 4 KiB to a live peer, 300 times each, while a tenth
opens a session to a SIGSTOPped peer (its handshake waits until connect_timeout_ms) or,
in the baseline run, sits idle. Prints the nine threads' latency p50/p99 per transfer in
both runs and the ratio. A measure, not a test (the test is python/tests/test_mooncake.py's
ordering check).

Usage: py_stall_bench.py   (ORBITTE_LIBRARY set; run from the source tree)
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import numpy as np  # noqa: E402

from orbitte import mooncake  # noqa: E402

PEER = os.path.join(HERE, "..", "python", "tests", "peer.py")


def start_peer():
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "python"))
    p = subprocess.Popen([sys.executable, PEER, str(1 << 20), "{}"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    return p, json.loads(p.stdout.readline())


def run(stall):
    os.environ["OTE_CONNECT_TIMEOUT_MS"] = os.environ["OTE_HANDSHAKE_TIMEOUT_MS"] = "30000"
    live, linfo = start_peer()
    stopped, sinfo = start_peer()
    te = mooncake.TransferEngine()
    assert te.initialize("127.0.0.1", mooncake.P2PHANDSHAKE, "tcp", "") == 0
    src = np.zeros(1 << 20, np.uint8)
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    lat = []
    lock = threading.Lock()
    assert te.transfer_sync_write(linfo["address"], src.ctypes.data, linfo["rw"], 4096) == 0
    if stall:
        os.kill(stopped.pid, signal.SIGSTOP)
        time.sleep(0.2)

    def blocked():
        if stall:
            te.transfer_sync_write(sinfo["address"], src.ctypes.data, sinfo["rw"], 4096)

    def worker(t):
        mine = []
        for r in range(300):
            off = (t * 300 + r) % 256 * 4096
            t0 = time.perf_counter()
            assert te.transfer_sync_write(linfo["address"], src.ctypes.data + off,
                                          linfo["rw"] + off, 4096) == 0
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    b = threading.Thread(target=blocked)
    b.start()
    ws = [threading.Thread(target=worker, args=(t,)) for t in range(9)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    os.kill(stopped.pid, signal.SIGCONT)
    b.join()
    te.close()
    for p in (live, stopped):
        p.kill()
        p.wait()
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


base = run(False)
stall = run(True)
print("9 threads x 300 WRITEs of 4 KiB to a live peer (tcp engine, shm to a local peer):")
print("  without a stopped peer: p50 %7.1f us  p99 %7.1f us" % base)
print("  tenth thread on a SIGSTOPped peer: p50 %7.1f us  p99 %7.1f us  (p99 %.2fx)"
      % (stall[0], stall[1], stall[1] / base[1]))
