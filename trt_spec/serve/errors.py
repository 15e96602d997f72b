"""ServerError: why a server cannot start or stopped serving, in one actionable line."""

from __future__ import annotations

from ..errors import TrtSpecError


class ServerError(TrtSpecError, RuntimeError):
    pass
