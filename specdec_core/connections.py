"""What the HTTP servers specdec runs (`specdec collect`'s, `specdec metrics serve`'s) bound their clients by:
a thread per connection, at most so many at once, and a way to end a connection from another thread."""

from __future__ import annotations

import socket
import threading
from typing import Any


class BoundedThreads:
    """Mixin for a socketserver.ThreadingMixIn server: a thread per connection, at most `max_connections` at
    once; the next waits up to `slot_wait_s` to be taken (the server accepts nothing else meanwhile), then is
    closed. Without it each client that connects and holds on, however slowly, held a thread."""

    max_connections: int
    slot_wait_s: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(timeout=self.slot_wait_s):
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slots.release()


def cut(connection: socket.socket) -> None:
    """End a connection now, from any thread: a read blocked on it returns; one already gone is left as it is."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
