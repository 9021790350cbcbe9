"""OrbitTE statuses as Python exceptions.

Every failed call raises an OrbitteError subclass carrying the status: `.status` (the raw
ote_status_t), `.code`, `.name` ("OTE_ERR_PEER_LOST"), `.errno` (of a failed native call,
else 0) and `.scope`. The classes follow the blast radius of the status code:

    OrbitteError
      RequestError   this request or call failed; nothing else is affected (1..99)
      PeerError      the peer or its connection is unusable (100..199)
      DeviceError    a device, port or native owner failed (200..299)

and each code has its own class below its scope, e.g. PeerLostError(PeerError) for
OTE_ERR_PEER_LOST and AccessError(RequestError) for OTE_ERR_ACCESS (ERROR_CLASSES maps
every code to its class). OTE_ERR_TIMEOUT's class, TimeoutError_, also derives from
Python's TimeoutError so `except TimeoutError` works.
"""

import builtins

SCOPE_NONE, SCOPE_REQUEST, SCOPE_PEER, SCOPE_DEVICE = 0, 1, 2, 3

# code: (name, class name, scope). The one table of <ote/status.h>'s codes on this side.
CODES = {
    1: ("OTE_ERR_INVALID", "InvalidError", SCOPE_REQUEST),
    2: ("OTE_ERR_NOMEM", "NoMemoryError", SCOPE_REQUEST),
    3: ("OTE_ERR_ACCESS", "AccessError", SCOPE_REQUEST),
    4: ("OTE_ERR_NOT_FOUND", "NotFoundError", SCOPE_REQUEST),
    5: ("OTE_ERR_EXISTS", "ExistsError", SCOPE_REQUEST),
    6: ("OTE_ERR_BUSY", "BusyError", SCOPE_REQUEST),
    7: ("OTE_ERR_AGAIN", "AgainError", SCOPE_REQUEST),
    8: ("OTE_ERR_TIMEOUT", "TimeoutError_", SCOPE_REQUEST),
    9: ("OTE_ERR_CANCELED", "CanceledError", SCOPE_REQUEST),
    10: ("OTE_ERR_UNSUPPORTED", "UnsupportedError", SCOPE_REQUEST),
    11: ("OTE_ERR_TOO_BIG", "TooBigError", SCOPE_REQUEST),
    12: ("OTE_ERR_FAULT", "FaultError", SCOPE_REQUEST),
    13: ("OTE_ERR_STATE", "StateError", SCOPE_REQUEST),
    100: ("OTE_ERR_PEER_LOST", "PeerLostError", SCOPE_PEER),
    101: ("OTE_ERR_PROTOCOL", "ProtocolError", SCOPE_PEER),
    102: ("OTE_ERR_VERSION", "VersionError", SCOPE_PEER),
    103: ("OTE_ERR_CONNECT", "ConnectError", SCOPE_PEER),
    104: ("OTE_ERR_REMOTE_ACCESS", "RemoteAccessError", SCOPE_PEER),
    105: ("OTE_ERR_REMOTE", "RemoteError", SCOPE_PEER),
    106: ("OTE_ERR_AUTH", "AuthError", SCOPE_PEER),
    200: ("OTE_ERR_NATIVE", "NativeError", SCOPE_DEVICE),
    201: ("OTE_ERR_NO_DEVICE", "NoDeviceError", SCOPE_DEVICE),
    202: ("OTE_ERR_PORT_DOWN", "PortDownError", SCOPE_DEVICE),
    203: ("OTE_ERR_DEVICE_FATAL", "DeviceFatalError", SCOPE_DEVICE),
    204: ("OTE_ERR_RETAINED", "RetainedError", SCOPE_DEVICE),
    205: ("OTE_ERR_FENCED", "FencedError", SCOPE_DEVICE),
    206: ("OTE_ERR_IO", "IOError_", SCOPE_DEVICE),
}


def status_code(status):
    return status & 0xFFFF


def status_errno(status):
    return (status >> 16) & 0x7FFF


class OrbitteError(Exception):
    """A failed OrbitTE call. str() is the library's description plus what was done."""

    code = None

    def __init__(self, status, message=None, description=None):
        self.status = status
        self.code = status_code(status)
        self.errno = status_errno(status)
        entry = CODES.get(self.code)
        self.name = entry[0] if entry else "OTE_ERR_%d" % self.code
        self.scope = entry[2] if entry else SCOPE_NONE
        self.description = description or self.name
        self.message = message
        super().__init__(self.description if not message else "%s: %s" % (message, self.description))


class RequestError(OrbitteError):
    """Request scope: this request or call failed; nothing else is affected."""


class PeerError(OrbitteError):
    """Peer scope: the peer or the connection to it is unusable."""


class DeviceError(OrbitteError):
    """Device (context) scope: a device, port or native owner failed."""


_SCOPE_BASES = {SCOPE_REQUEST: RequestError, SCOPE_PEER: PeerError, SCOPE_DEVICE: DeviceError}
ERROR_CLASSES = {}
for _code, (_name, _cls, _scope) in CODES.items():
    _bases = (_SCOPE_BASES[_scope],)
    if _code == 8:
        _bases += (builtins.TimeoutError,)
    ERROR_CLASSES[_code] = type(
        _cls, _bases, {"code": _code, "__doc__": "%s (%s)." % (_name, _bases[0].__name__)}
    )
    globals()[_cls] = ERROR_CLASSES[_code]


def error_class(status):
    """The exception class of a status (OrbitteError for an unknown code)."""
    return ERROR_CLASSES.get(status_code(status), OrbitteError)


__all__ = ["OrbitteError", "RequestError", "PeerError", "DeviceError", "ERROR_CLASSES",
           "error_class", "status_code", "status_errno"] + [c[1] for c in CODES.values()]
