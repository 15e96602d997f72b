"""ServerError: why a server cannot be launched, or stopped serving, as one line a user can act on. Every module of
serve/ raises it; `trt-spec serve` prints it (exit 2 before the server starts, 1 after)."""

from __future__ import annotations

from ..errors import TrtSpecError


class ServerError(TrtSpecError, RuntimeError):
    pass
