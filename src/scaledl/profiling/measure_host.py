"""What a collective costs the host, measured for ``scaledl simulate profile``: the work a
collective does beside compute (for the interference ``kappa``) and the CPU's cost per byte of
a loopback TCP stream (``tcp_beta``)."""

from __future__ import annotations

import socket
import statistics
import threading
import time

import torch

__all__ = ["busy_work", "drain", "tcp_cost"]


def busy_work(device: torch.device, stop: threading.Event) -> None:
    """What a collective does beside compute: a loopback TCP stream and a reduction (a
    reduction kernel on another stream on CUDA)."""
    chunk = 1 << 20
    if device.type == "cuda":
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        a = torch.ones(chunk * 8, device=device)
        with torch.cuda.stream(stream):
            while not stop.is_set():
                a.add_(a)
                stream.synchronize()
        return
    left, right = socket.socketpair()
    left.settimeout(5.0)
    right.settimeout(5.0)

    def send() -> None:
        payload = bytes(chunk)
        try:
            while not stop.is_set():
                left.sendall(payload)
        except OSError:
            pass  # the receiver closed its end

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    a, b = torch.ones(chunk // 4), torch.ones(chunk // 4)
    sink = bytearray(chunk)
    view = memoryview(sink)
    try:
        while not stop.is_set():
            got = 0
            while got < chunk:
                got += right.recv_into(view[got:], chunk - got)
            a.add_(b)
    except OSError:
        pass
    finally:
        right.close()
        left.close()
        sender.join()


def drain(conn: socket.socket, nbytes: int, chunk: int) -> int:
    """Receive up to ``nbytes`` from ``conn`` in ``chunk``-sized reads (fewer if the peer
    closes first); the bytes received."""
    buffer, got = bytearray(chunk), 0
    while got < nbytes:
        n = conn.recv_into(buffer)
        if n == 0:
            break
        got += n
    return got


def tcp_cost(nbytes: int = 64 << 20, chunk: int = 1 << 20, repeats: int = 3) -> float:
    """CPU seconds per byte at each end of a loopback TCP stream (the median of ``repeats``)."""
    results = []
    for _ in range(repeats):
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]

        def sink(server: socket.socket = server) -> None:
            conn, _ = server.accept()
            with conn:
                drain(conn, nbytes, chunk)

        receiver = threading.Thread(target=sink, daemon=True)
        receiver.start()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            payload = bytes(chunk)
            start = time.perf_counter()
            for _ in range(nbytes // chunk):
                conn.sendall(payload)
            receiver.join()
            results.append((time.perf_counter() - start) / nbytes)
        server.close()
    return statistics.median(results)
