"""CPU cost of one TCP stream per byte: run under `scaledl cluster run --ranks-per-host 1`
(rank 0 sends NBYTES to rank 1 across the emulated link) or with --loopback (both ends in this
process's namespace).  Prints one JSON line: seconds per byte at each end (the stream's time
over its bytes; sender and receiver run at once on separate cores)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from scaledl.profiling.measure_host import drain

NBYTES, CHUNK, PORT = 256 << 20, 1 << 20, 29517


def send(host: str) -> float:
    for _ in range(100):  # the receiver may not listen yet
        try:
            conn = socket.create_connection((host, PORT), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"cannot connect to {host}:{PORT}")
    payload = bytes(CHUNK)
    with conn:
        start = time.perf_counter()
        for _ in range(NBYTES // CHUNK):
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the receiver's acknowledgement: every byte arrived
        return time.perf_counter() - start


def receive(bind: str) -> None:
    with socket.create_server((bind, PORT)) as server:
        conn, _ = server.accept()
        with conn:
            drain(conn, NBYTES, CHUNK)
            conn.sendall(b"k")


def main() -> None:
    if "--loopback" in sys.argv:
        receiver = threading.Thread(target=receive, args=("127.0.0.1",))
        receiver.start()
        seconds = send("127.0.0.1")
        receiver.join()
        print(json.dumps({"path": "loopback", "s_per_byte": seconds / NBYTES}))
        return
    rank = int(os.environ["RANK"])
    if rank == 1:
        receive("0.0.0.0")
        return
    peer = os.environ["MASTER_ADDR"].rsplit(".", 1)[0] + ".2"  # host 1 (see docs/cluster.md)
    seconds = send(peer)
    print(json.dumps({"path": "link", "s_per_byte": seconds / NBYTES}))


if __name__ == "__main__":
    main()
