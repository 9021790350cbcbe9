"""The library's log lines as Python logging records (orbitte.route_logs_to_python).

    import logging, orbitte
    logging.basicConfig(level=logging.INFO)
    orbitte.route_logs_to_python(level=logging.INFO)   # lines go to logging.getLogger("orbitte")
    ...
    orbitte.stop_routing_logs()                          # back to stderr

Process-wide, like the library's log callback (<ote/log.h>, ote_log_set_callback) it
installs: every engine of the process, and lines written outside any engine, go to the
"orbitte" logger. Each record's message is "[component] message"; the record also carries
`component` (the layer: "engine", "tcp", "shm", "rdma", ...) and `engine` (the engine's
tag: "name@host:port" for an engine with an engine_name, else its address "host:port";
None when the line knows no engine) as attributes. Levels:
ERROR, WARNING, INFO, DEBUG, and TRACE as level 5 (TRACE_LEVEL).

Lines come from whatever thread wrote them, the library's own threads included; ctypes
takes the GIL for each. Lines are delivered one at a time: every thread that logs waits
while a handler runs, so handlers of the "orbitte" logger must be quick and must not call
into orbitte (a line written inside a handler goes to stderr instead).
"""

import atexit
import logging
import threading

from . import engine as _engine
from ._lib import LogCallback

LOGGER_NAME = "orbitte"
TRACE_LEVEL = 5  # below logging.DEBUG
logging.addLevelName(TRACE_LEVEL, "TRACE")

# OTE_LOG_* of <ote/log.h> -> logging levels, and back.
_TO_PY = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG, 4: TRACE_LEVEL}

_lock = threading.Lock()  # installs and removals
_installed = None  # the LogCallback the library holds: alive until it is replaced


def _c_level(level):
    """The library's level that produces every line at or above the logging level."""
    if isinstance(level, str):
        name = level
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError("unknown logging level %r" % name)
    for c in range(5):
        if _TO_PY[c] <= level:
            return c
    return 4


def _on_line(_arg, level, component, engine, message):
    # Called from C: nothing may raise out of here.
    try:
        py_level = _TO_PY.get(level, logging.ERROR)
        logger = logging.getLogger(LOGGER_NAME)
        if not logger.isEnabledFor(py_level):
            return
        comp = component.decode("utf-8", "replace") if component else "-"
        eng = engine.decode("utf-8", "replace") if engine else None
        text = message.decode("utf-8", "replace") if message else ""
        logger.log(py_level, "[%s] %s", comp, text, extra={"component": comp, "engine": eng})
    except Exception:  # noqa: BLE001 - a broken handler must not unwind into C
        pass


def route_logs_to_python(level=None):
    """Send the library's lines to logging.getLogger("orbitte") from now on.

    level (a logging level, number or name), when given, also sets the library's
    process-wide level to the one that writes every line at or above it (lines below the
    library's level are never written: OTE_LOG_LEVEL, the log_level key, or this). The
    logger's own level and handlers filter as usual."""
    global _installed
    if level is not None:
        _engine.lib.ote_log_set_level(_c_level(level))
    cb = LogCallback(_on_line)
    with _lock:
        _engine.check(_engine.lib.ote_log_set_callback(cb, None), "ote_log_set_callback")
        _installed = cb  # the previous one is neither running nor called any more


def stop_routing_logs():
    """Lines go to stderr again (the library's default format)."""
    global _installed
    with _lock:
        if _installed is None:
            return
        _engine.check(_engine.lib.ote_log_set_callback(LogCallback(), None),
                      "ote_log_set_callback")
        _installed = None


def library_log_level():
    """The library's process-wide level as a logging level."""
    return _TO_PY.get(_engine.lib.ote_log_level(), logging.WARNING)


# Engines' threads may still log while the interpreter shuts down: back to stderr first.
atexit.register(stop_routing_logs)
