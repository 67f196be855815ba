"""An HTTP server for the embedded stand-ins that keeps a departed client out of stderr."""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("agap.board")


class QuietServer(ThreadingHTTPServer):
    """:class:`ThreadingHTTPServer` that notes a client gone before its reply at debug.

    A client that timed out or whose process ended is no fault of the server's. The
    standard library prints a traceback for it to whatever ``sys.stderr`` is at that
    moment, which in one process can be the middle of another command's output.
    """

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("%s left before its reply", client_address)
            return
        super().handle_error(request, client_address)


__all__ = ["QuietServer"]
