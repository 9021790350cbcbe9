"""A peer process for the binding's tests: an engine with two registered numpy arrays,
driven by one command per line on stdin, answering one JSON object per line on stdout.

    python3 peer.py SIZE [CONFIG_JSON]
prints {"address", "rw", "ro", "size"}: "rw" is registered READ|WRITE and "ro" READ only,
both SIZE bytes filled with pattern(SIZE, seed 1) and pattern(SIZE, seed 2). Commands:
    digest                 sha256 of rw
    fill SEED              rw := pattern(SIZE, SEED)
    recv SECONDS           next notification: {"message": hex, "sender"} or {"message": null}
    recvdigest SECONDS     the same, plus the digest of rw taken right after receiving
    send PEER HEX          ote_notify_send the bytes to PEER ("host:port")
    write PEER ADDR N SEED WRITE pattern(N, SEED) to PEER's ADDR (answers {"ok"} or the error)
    read PEER ADDR N 0     READ N bytes from PEER's ADDR: {"digest"} or the error name
    reg NAME SEED          register a new array pattern(SIZE, SEED) READ|WRITE as NAME:
                           {"address"} or the error name
    unreg NAME             unregister the array registered as NAME: {"ok"} or the error
    digestof NAME          sha256 of the array registered as NAME
    quit                   close the engine and exit 0
"""

import hashlib
import json
import sys

import numpy as np

import orbitte


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def main():
    size = int(sys.argv[1])
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    with orbitte.Engine(config) as eng:
        rw, ro = pattern(size, 1), pattern(size, 2)
        reg_rw = eng.register(rw, perms=orbitte.PERM_RW, name="rw")
        reg_ro = eng.register(ro, perms=orbitte.PERM_READ, name="ro")

        def say(obj):
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

        named = {"rw": reg_rw, "ro": reg_ro}
        say({"address": eng.address, "rw": reg_rw.address, "ro": reg_ro.address, "size": size})
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "digest":
                say({"digest": hashlib.sha256(rw.tobytes()).hexdigest()})
            elif cmd[0] == "fill":
                rw[:] = pattern(size, int(cmd[1]))
                say({"ok": True})
            elif cmd[0] in ("recv", "recvdigest"):
                n = eng.notify_recv(float(cmd[1]))
                out = {"message": None if n is None else n.message.hex(),
                       "sender": None if n is None else n.sender}
                if cmd[0] == "recvdigest":
                    out["digest"] = hashlib.sha256(rw.tobytes()).hexdigest()
                say(out)
            elif cmd[0] == "send":
                eng.notify_send(cmd[1], bytes.fromhex(cmd[2]))
                say({"ok": True})
            elif cmd[0] in ("write", "read"):
                n = int(cmd[3])
                buf = pattern(n, int(cmd[4])) if cmd[0] == "write" else np.zeros(n, np.uint8)
                try:
                    getattr(eng, cmd[0])(cmd[1], buf, int(cmd[2]), timeout=60)
                except orbitte.OrbitteError as e:
                    say({"error": e.name})
                    continue
                say({"ok": True, "digest": hashlib.sha256(buf.tobytes()).hexdigest()})
            elif cmd[0] == "reg":
                try:
                    named[cmd[1]] = eng.register(pattern(size, int(cmd[2])), name=cmd[1])
                except orbitte.OrbitteError as e:
                    say({"error": e.name})
                    continue
                say({"address": named[cmd[1]].address})
            elif cmd[0] == "unreg":
                try:
                    named.pop(cmd[1]).unregister()
                except orbitte.OrbitteError as e:
                    say({"error": e.name})
                    continue
                say({"ok": True})
            elif cmd[0] == "digestof":
                say({"digest": hashlib.sha256(named[cmd[1]].obj.tobytes()).hexdigest()})
            elif cmd[0] == "quit":
                break
            else:
                say({"error": "unknown command %r" % cmd[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
