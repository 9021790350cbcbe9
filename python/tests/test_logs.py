"""orbitte.route_logs_to_python: the library's lines as records of the "orbitte" logger,
from the library's own threads too; the level it sets; and stderr again afterwards, in
<ote/log.h>'s documented format."""

import logging
import re
import threading
import time

import numpy as np
import pytest

import orbitte
from orbitte import engine as _engine

LINE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z orbitte "
                  r"[EWIDT] pid=[0-9]+ tid=[0-9]+( engine=[^ ]+)? \[[^]]+\] .*$")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=1)
        self.records = []
        self.cv = threading.Condition()

    def emit(self, record):
        with self.cv:
            self.records.append(record)
            self.cv.notify_all()

    def wait_for(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                found = [r for r in self.records if pred(r)]
                left = deadline - time.monotonic()
                if found or left <= 0:
                    return found
                self.cv.wait(left)


@pytest.fixture
def records():
    """A handler on the "orbitte" logger; routing, level and logger put back afterwards."""
    level = _engine.lib.ote_log_level()
    logger = logging.getLogger("orbitte")
    h = Records()
    logger.addHandler(h)
    old = logger.level
    logger.setLevel(1)
    yield h
    orbitte.stop_routing_logs()
    logger.removeHandler(h)
    logger.setLevel(old)
    _engine.lib.ote_log_set_level(level)


def test_refused_request_arrives_as_a_warning_record(records):
    orbitte.route_logs_to_python(level=logging.WARNING)
    cfg = {"listen_address": "127.0.0.1:0", "transports": "tcp"}
    with orbitte.Engine(cfg) as a, orbitte.Engine(cfg) as b:
        buf = np.zeros(4096, np.uint8)
        b.register(buf)
        # b refuses it on its worker thread, a C thread: the record may come after the
        # raise. The WARN is rate-limited per call site for the whole process (once a
        # second): an earlier test's refusal may hide this one, so refuse again for a while.
        for wait_s in (1.2, 1.2, 30):
            with pytest.raises(orbitte.AccessError):  # 100 bytes past b's registration
                a.write(b.address, np.ones(4096, np.uint8), buf.ctypes.data + 100)
            found = records.wait_for(lambda r: "refused WRITE" in r.getMessage(), wait_s)
            if found:
                break
        assert found, [r.getMessage() for r in records.records]
        r = found[0]
        assert r.name == "orbitte" and r.levelno == logging.WARNING
        assert r.component == "tcp" and r.engine == b.address
        assert r.getMessage().startswith("[tcp] refused WRITE request of 4096 bytes")
        assert r.thread != threading.get_ident()  # written by the library's thread


def test_level_sets_the_library_level_and_lines_without_an_engine(records):
    orbitte.route_logs_to_python(level="debug")
    assert orbitte.library_log_level() == logging.DEBUG
    orbitte.route_logs_to_python(level=orbitte.TRACE_LEVEL)
    assert orbitte.library_log_level() == orbitte.TRACE_LEVEL
    orbitte.route_logs_to_python(level=logging.ERROR)
    assert orbitte.library_log_level() == logging.ERROR
    with pytest.raises(ValueError):
        orbitte.route_logs_to_python(level="loudest")
    orbitte.route_logs_to_python(level=logging.WARNING)
    with pytest.raises(orbitte.InvalidError):  # a configuration refused: a WARN, no engine
        orbitte.Engine({"log_level": "noisy"})
    found = records.wait_for(lambda r: "invalid log_level" in r.getMessage(), timeout=5)
    assert found and found[0].levelno == logging.WARNING
    assert found[0].component == "engine" and found[0].engine is None
    assert found[0].thread == threading.get_ident()


def test_stop_routing_sends_lines_to_stderr_again(records, capfd):
    orbitte.route_logs_to_python(level=logging.WARNING)
    orbitte.stop_routing_logs()
    orbitte.stop_routing_logs()  # twice is harmless
    with pytest.raises(orbitte.InvalidError):
        orbitte.Engine({"log_level": "noisy"})
    err = capfd.readouterr().err
    assert not [r for r in records.records if "invalid log_level" in r.getMessage()]
    lines = [l for l in err.splitlines() if "invalid log_level" in l]
    assert len(lines) == 1 and LINE.match(lines[0]), err
    assert " W " in lines[0] and "[engine]" in lines[0] and " engine=" not in lines[0]


def test_a_failing_handler_does_not_reach_the_library(records):
    class Broken(logging.Handler):
        def emit(self, record):
            raise RuntimeError("handler bug")

    logger = logging.getLogger("orbitte")
    broken = Broken()
    logger.addHandler(broken)
    raise_exc, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        orbitte.route_logs_to_python(level=logging.WARNING)
        with pytest.raises(orbitte.InvalidError):
            orbitte.Engine({"log_level": "noisy"})
        assert records.wait_for(lambda r: "invalid log_level" in r.getMessage(), timeout=5)
    finally:
        logging.raiseExceptions = raise_exc
        logger.removeHandler(broken)
