"""Fixtures the sandbox suites share."""

import socket
import threading

import pytest


@pytest.fixture()
def server():
    """A TCP server on 127.0.0.1: yields (port, the first bytes of each accepted connection),
    so a test can prove that a sandboxed program did or did not reach the loopback."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn.recv(100))
            conn.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join()
    srv.close()
