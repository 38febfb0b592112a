"""A stdlib-only ftgovd client for the container checks (the container's /usr/bin/python3 has no ftgov installed in it).

    python3 ctclient.py call METHOD [PARAMS_JSON]   one request; prints the reply's JSON; exit 3 if connecting
                                                     is refused
    python3 ctclient.py job RESULT_FILE NAME        register a job with this process, write the reply to RESULT_FILE,
                                                    tell systemd READY=1 (so `systemd-run -p Type=notify` returns only
                                                    once the job is registered), then live until killed

It speaks the protocol by hand on purpose: the checks test the daemon, not governor.client.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys

SOCKET_PATH = os.environ.get("FTGOV_SOCKET", "/run/ftgov/ftgov.sock")
# A small decoder, so the tree's pick is a reduced frequency rather than the top level (the paper's small-model case).
JOB_FEATURES = {"model_type": "decoder", "num_layers": 6, "hidden_size": 512, "seq_len": 128, "gpu_util": 60}


class Connection:
    def __init__(self, path: str = SOCKET_PATH, timeout_s: float = 20.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")
        self.ids = itertools.count(1)

    def call(self, method: str, params: dict | None = None) -> dict:
        """The whole reply object (result or error)."""
        request = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params or {}}
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        line = self.reader.readline()
        if not line:
            raise ConnectionError("ftgovd closed the connection without replying")
        return json.loads(line)


def notify_ready(status: str) -> None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(f"READY=1\nSTATUS={status}".encode(), addr)


def run_job(result_file: str, name: str) -> int:
    conn = Connection()
    reply = conn.call("register", dict(JOB_FEATURES, name=name))
    reply["pid"] = os.getpid()
    with open(result_file + ".tmp", "w") as f:
        json.dump(reply, f)
    os.rename(result_file + ".tmp", result_file)
    notify_ready(f"registered: {reply.get('result') or reply.get('error')}")
    # Keep the connection (and so the job) open until we are killed; survive the daemon's death so that a restarted
    # daemon can re-adopt this still-living process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def main(argv: list[str]) -> int:
    if argv[:1] == ["call"] and len(argv) in (2, 3):
        try:
            conn = Connection()
        except PermissionError as e:
            print(f"refused: {e}", file=sys.stderr)
            return 3
        print(json.dumps(conn.call(argv[1], json.loads(argv[2]) if len(argv) == 3 else {})))
        return 0
    if argv[:1] == ["job"] and len(argv) == 3:
        return run_job(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
