"""The connector's residency endpoint: a ``/load``-compatible HTTP listener in the
engine-core process, beside the retention state it reports (docs/vllm.md,
"Residency endpoint")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer

logger = logging.getLogger("tether_vllm")

# A connection that sends nothing for this long is closed: the listener serves one
# connection at a time, so a stalled client delays the next poll by at most this.
CONNECTION_TIMEOUT_S = 1.0
# The largest request body a POST route reads (a lease request's pull chain).
MAX_BODY = 4 << 20

# A route's answer: (status, JSON body).
Answer = tuple[int, bytes]


class _Server(HTTPServer):
    def handle_error(self, request, client_address) -> None:
        # A client that hung up or sent garbage: its connection ends, serving goes on.
        logger.debug("residency listener: connection from %s failed", client_address, exc_info=True)


class ResidencyListener:
    """Serves ``GET /load`` with ``report()`` (JSON bytes), ``GET /stats`` with
    ``stats()`` when given (the connector's counters), and the extra ``get`` and ``post``
    routes (the state pull's lease endpoints: each answers ``(status, JSON body)``; a
    ``post`` route gets the request body, at most ``MAX_BODY`` bytes, else 413), from a
    daemon thread.

    One connection at a time, HTTP/1.0 (closed after each answer): a poll costs one
    ``report()`` call under the GIL. Anything else is 404 (other paths) or 501 (other
    methods); a route that raises is a 503, logged once per distinct error, and the
    listener keeps serving.
    """

    def __init__(
        self,
        host: str,
        port: int,
        report: Callable[[], bytes],
        stats: Callable[[], bytes] | None = None,
        get: dict[str, Callable[[], Answer]] | None = None,
        post: dict[str, Callable[[bytes], Answer]] | None = None,
    ):
        self._report = report
        self._stats = stats
        self._last_error: str | None = None
        listener = self
        # Looked up at each request (a test swaps ``_report`` for a failing one).
        gets: dict[str, Callable[[], Answer]] = {"/load": lambda: (200, listener._report())}
        if stats is not None:
            gets["/stats"] = lambda: (200, listener._stats())
        gets.update(get or {})
        posts = dict(post or {})

        class Handler(BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT_S
            server_version = "tether-vllm"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                route = gets.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(404)
                    return
                self._answer(route)

            def do_POST(self) -> None:  # noqa: N802
                route = posts.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(501)
                    return
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    n = -1
                if not 0 <= n <= MAX_BODY:
                    self.send_error(413 if n > MAX_BODY else 400)
                    return
                body = self.rfile.read(n)
                self._answer(lambda: route(body))

            def _answer(self, route: Callable[[], Answer]) -> None:
                try:
                    status, body = route()
                except Exception as e:  # noqa: BLE001 — any failure is a 503, never a crash
                    listener._failed(e)
                    self.send_error(503, "report unavailable")
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002
                logger.debug("residency listener: " + format, *args)

        self._server = _Server((host, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="tether-residency",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one the OS chose for 0)."""
        return self._server.server_address[1]

    def _failed(self, e: Exception) -> None:
        msg = f"{type(e).__name__}: {e}"
        if msg != self._last_error:
            self._last_error = msg
            logger.warning("residency listener: a report failed (%s)", msg)

    def close(self) -> None:
        """Stops serving and frees the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
