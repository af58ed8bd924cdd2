"""The MPI job's output, shown by the Spark driver as it comes (what `mpiexec` would print on the console).

Task 0 runs mpiexec, which forwards every rank's stdout and stderr; the task sends each line over TCP to a
server the driver started (`LineServer`), and the driver writes it to its stderr. Executors always reach the
driver (Spark's own traffic does), so this works on any cluster; no shared file system is assumed, and a
line arrives within moments, not at the task's end as an accumulator's update would. PySpark's
TorchDistributor streams its processes' output to the driver the same way.
"""
from __future__ import annotations

import socket
import socketserver
import sys
import threading


class LineServer:
    """A TCP server on the driver writing each line it receives to `out` (default: sys.stderr); a context
    manager that stops it. `address` is what the tasks connect to."""

    def __init__(self, host: str, out=None):
        out = out or sys.stderr
        self._handlers = handlers = []

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                handlers.append(threading.current_thread())
                for line in self.rfile:
                    out.write(line.decode(errors="replace"))
                    out.flush()

        self._server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), Handler)
        self._server.daemon_threads = True
        self.address = (host, self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="mpitrain-spark-log", daemon=True)
        self._thread.start()

    def __enter__(self) -> LineServer:
        return self

    def __exit__(self, *_) -> None:
        self._server.shutdown()
        for handler in self._handlers:  # the last lines of a finished task, still on their way
            handler.join(timeout=5)
        self._server.server_close()


class LineSender:
    """Task 0's end: send lines to the driver's `LineServer`; a driver it cannot reach costs the output, not
    the job."""

    def __init__(self, address: tuple[str, int]):
        try:
            self._socket = socket.create_connection(address, timeout=30)
        except OSError:
            self._socket = None

    def send(self, line: str) -> None:
        if self._socket is not None:
            try:
                self._socket.sendall(line.encode())
            except OSError:
                self._socket = None

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
