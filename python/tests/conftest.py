"""Fixtures of the binding's tests: the package on sys.path, and peer processes
(tests/peer.py) that are always reaped, killed if they do not quit in time."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PYTHON_DIR)

import orbitte  # noqa: E402

PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer.py")
ANSWER_TIMEOUT_S = 60  # generous: a loaded 2-core machine


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class Peer:
    """A peer.py process: .address, .rw, .ro, .size; ask(cmd) -> its JSON answer."""

    def __init__(self, size, config=None):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, ORBITTE_LIBRARY=orbitte.library_path)
        self.proc = subprocess.Popen(
            [sys.executable, PEER_SCRIPT, str(size), json.dumps(config or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        hello = self._answer()
        self.address, self.rw, self.ro, self.size = (
            hello["address"], hello["rw"], hello["ro"], hello["size"])

    def _answer(self):
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(ANSWER_TIMEOUT_S):
                raise AssertionError("peer gave no answer within %d s" % ANSWER_TIMEOUT_S)
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("peer exited (%s)" % self.proc.poll())
        return json.loads(line)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self):
        """SIGSTOP, returning once the process is certainly stopped (state T)."""
        self.signal(signal.SIGSTOP)
        end = time.monotonic() + ANSWER_TIMEOUT_S
        while time.monotonic() < end:
            with open("/proc/%d/stat" % self.proc.pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
            time.sleep(0.001)
        raise AssertionError("peer did not stop within %d s" % ANSWER_TIMEOUT_S)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(ANSWER_TIMEOUT_S)

    def quit(self):
        """Ask it to close its engine and exit; its exit status (0 when clean)."""
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            return self.proc.wait(ANSWER_TIMEOUT_S)
        finally:
            self.kill()


@pytest.fixture
def make_peer():
    peers = []

    def make(size=1 << 20, config=None):
        p = Peer(size, config)
        peers.append(p)
        return p

    yield make
    for p in peers:
        if p.proc.poll() is None:
            try:
                p.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        p.kill()


@pytest.fixture
def peer(make_peer):
    return make_peer()


@pytest.fixture
def engine():
    with orbitte.Engine({"listen_address": "127.0.0.1:0"}) as eng:
        yield eng
