"""Python submission rate against ote_bench's, same shape, same run (issue 27).

Usage: py_submit_bench.py <ote_bench> [seconds] [transport]

Starts `ote_bench --role target` as the peer, then measures WRITE batches of 4,096 x
4 KiB requests for `seconds` each (default 3), one thread, one batch in flight:
  - ote_bench itself (its own initiator against the same kind of target, --json),
  - Batch.submit_arrays with numpy uint64 arrays (ote_batch_submit_v),
  - Batch.submit with one (opcode, address, segment, remote, length) tuple per request,
and prints requests/s of each and the ratios to ote_bench. A measure, not a test: the
machine's noise moves each figure; run it a few times.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import orbitte  # noqa: E402

N, BLOCK = 4096, 4096


def start_target(bench, transport):
    proc = subprocess.Popen([bench, "--role", "target", "--listen", "127.0.0.1:0",
                             "--buffer-size", str(N * BLOCK), "--transport", transport],
                            stdout=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if line.startswith("OTEB1 TARGET "):
            _, _, addr, buf, length = line.split()
            return proc, addr, int(buf, 0)
    proc.kill()
    raise SystemExit("the target printed no address")


def rate(fn, seconds):
    fn()  # warm-up: sessions, first faults
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        fn()
        n += N
    return n / (time.monotonic() - start)


def main():
    bench = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    transport = sys.argv[3] if len(sys.argv) > 3 else "shm"
    out = subprocess.run([bench, "--no-progress", "--transport", transport, "--op", "write",
                          "--block-size", "4K", "--batch-size", str(N), "--threads", "1",
                          "--duration", "%gs" % seconds, "--json"],
                         capture_output=True, text=True, check=True).stdout
    ref = json.loads(out.strip().splitlines()[-1])["ops_per_sec"]
    proc, addr, rbuf = start_target(bench, transport)
    try:
        with orbitte.Engine({"transports": transport, "listen_address": "127.0.0.1:0"}) as eng:
            src = np.zeros(N * BLOCK, np.uint8)
            eng.register(src)
            seg = eng.session(addr)
            local = src.ctypes.data + np.arange(N, dtype=np.uint64) * BLOCK
            remote = np.uint64(rbuf) + np.arange(N, dtype=np.uint64) * BLOCK
            lengths = np.full(N, BLOCK, np.uint64)
            tuples = [(orbitte.WRITE, int(local[i]), seg, int(remote[i]), BLOCK)
                      for i in range(N)]
            with eng.batch(N) as b:
                def arrays():
                    b.submit_arrays(orbitte.WRITE, seg, local, remote, lengths)
                    b.wait(60)
                    b.reset()

                def per_tuple():
                    b.submit(tuples)
                    b.wait(60)
                    b.reset()

                arr = rate(arrays, seconds)
                tup = rate(per_tuple, seconds)
    finally:
        proc.terminate()
        proc.wait(30)
    print("%s WRITE 4,096 x 4 KiB per batch, 1 thread, %g s each:" % (transport, seconds))
    print("  ote_bench (C)             %10.0f requests/s" % ref)
    print("  Batch.submit_arrays       %10.0f requests/s  %.2fx" % (arr, arr / ref))
    print("  Batch.submit (tuples)     %10.0f requests/s  %.2fx" % (tup, tup / ref))


if __name__ == "__main__":
    main()
