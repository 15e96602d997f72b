"""The OpenAI frontend's guards: API key, body cap, admission of requests to Triton, send timeout.

The frontend bounds what it passes on: Triton's HTTP server crashes on large JSON bodies
(upstream-facts: triton-http-body-size-crash). Like vLLM, only /v1/* needs the key (probes and Prometheus carry none).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ...errors import TrtSpecError
from ...records.defaults import (
    OPENAI_API_KEY_ENV,
    OPENAI_MAX_BODY_BYTES,
    OPENAI_MAX_CONCURRENT,
    OPENAI_MAX_QUEUED,
    OPENAI_RETRY_AFTER_S,
    OPENAI_SEND_TIMEOUT_S,
)
from .requests import OpenAIError

# refusal reasons (metric label)
QUEUE_FULL, UNAUTHORIZED, TOO_LARGE = "queue_full", "unauthorized", "too_large"


class ApiKeyFileError(TrtSpecError, ValueError):
    """The key file is absent, unreadable or empty."""


@dataclass(frozen=True)
class Limits:
    """The frontend's own limits, each a frontend flag."""

    max_body_bytes: int = OPENAI_MAX_BODY_BYTES
    max_concurrent: int = OPENAI_MAX_CONCURRENT
    max_queued: int = OPENAI_MAX_QUEUED
    send_timeout_s: float = OPENAI_SEND_TIMEOUT_S
    api_key: Optional[str] = None  # None: no key asked for

    def __post_init__(self):
        for name in ("max_body_bytes", "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_queued < 0 or self.send_timeout_s <= 0:
            raise ValueError("max_queued must be at least 0 and send_timeout_s above 0")

    def __repr__(self) -> str:  # never the key
        return (
            f"Limits(max_body_bytes={self.max_body_bytes}, max_concurrent={self.max_concurrent}, "
            f"max_queued={self.max_queued}, send_timeout_s={self.send_timeout_s}, "
            f"api_key={'<set>' if self.api_key else None})"
        )


def read_api_key(path: Optional[str | Path], environ=os.environ) -> Optional[str]:
    """The file's first line, else $OPENAI_API_KEY_ENV, else None (no auth).

    Raises ApiKeyFileError for a bad file: a deployment meant to have a key must not come up open."""
    if path is None:
        return environ.get(OPENAI_API_KEY_ENV) or None
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ApiKeyFileError(
            f"API key file {path}: cannot be read ({type(e).__name__}); give a readable file"
        ) from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise ApiKeyFileError(f"API key file {path}: its first line is empty; write the key on it")
    return key


# -- ASGI helpers ----------------------------------------------------------------------------------------------


async def _send_error(send, e: OpenAIError, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(e.body()).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": e.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> Optional[bytes]:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v
    return None


def _protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def key_error(scope, key: bytes) -> Optional[OpenAIError]:
    """None if the request carries the key, else the 401 (never echoing what was sent)."""
    auth = _header(scope, b"authorization")
    parts = auth.split(None, 1) if auth else []
    if len(parts) != 2 or parts[0].lower() != b"bearer":
        message = "missing bearer token (Authorization: Bearer KEY): send the header with this server's API key"
    elif hmac.compare_digest(parts[1].strip(), key):
        return None
    else:
        message = "incorrect API key: send the key this server was started with"
    return OpenAIError(401, message, code="invalid_api_key")


class ApiKeyGuard:
    """Pure ASGI: /v1/* needs the bearer key; everything else passes."""

    def __init__(self, app, key: str, refused: Callable[[str], None] = lambda reason: None):
        self.app, self.key, self.refused = app, key.encode("utf-8"), refused

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _protected(scope.get("path", "")):
            err = key_error(scope, self.key)
            if err is not None:
                self.refused(UNAUTHORIZED)
                await _send_error(send, err, ((b"www-authenticate", b"Bearer"),))
                return
        await self.app(scope, receive, send)


class _SendTimedOut(TrtSpecError):
    pass


async def _within(awaitable, seconds: float) -> None:
    """`await awaitable`, or TimeoutError after `seconds`; asyncio.timeout on 3.11+ avoids a task per send."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            await awaitable
    else:  # pragma: no cover - 3.10 only
        await asyncio.wait_for(awaitable, seconds)


class SendTimeout:
    """Pure ASGI: a send blocked over `seconds` (uvicorn's send waits for the socket to drain) ends the app's call.

    The response is left incomplete, so uvicorn closes the connection."""

    def __init__(self, app, seconds: float, abandoned: Callable[[], None] = lambda: None):
        self.app, self.seconds, self.abandoned = app, seconds, abandoned

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timed_out = False

        async def timed_send(message):
            nonlocal timed_out
            try:
                await _within(send(message), self.seconds)
            except (TimeoutError, asyncio.TimeoutError):
                timed_out = True
                raise _SendTimedOut() from None

        try:
            await self.app(scope, receive, timed_send)
        except BaseException as e:  # noqa: BLE001 - starlette may wrap it in an ExceptionGroup
            if not timed_out or isinstance(e, asyncio.CancelledError):
                raise
            self.abandoned()


# -- The body --------------------------------------------------------------------------------------------------


def _too_large(size: str, cap: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"the request body is {size} bytes; this server takes at most {cap} bytes (the frontend's --max-body-bytes); "
        "send a shorter prompt",
        code="request_too_large",
    )


async def read_body(request, cap: int) -> Any:
    """The request's JSON, reading at most `cap` bytes; 413 beyond, 400 for bad or too deeply nested JSON."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise OpenAIError(400, f"Content-Length {length[:32]!r} is not a number")
        if int(length) > cap:
            raise _too_large(length, cap)
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > cap:
            raise _too_large(f"over {cap}", cap)
    try:
        return json.loads(buf)
    except RecursionError:
        raise OpenAIError(
            400, "the request body's JSON is nested deeper than the frontend parses (about 1000 levels); flatten it"
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise OpenAIError(400, "the request body is not valid JSON") from None


# -- Admission -------------------------------------------------------------------------------------------------


class Admission:
    """At most `concurrent` requests hold a slot and `queued` wait in order; beyond both, 429.

    A slot is held for the Triton call: acquire(), then release() once."""

    def __init__(self, concurrent: int, queued: int, refused: Callable[[str], None] = lambda reason: None):
        self.concurrent, self.queued, self.refused = concurrent, queued, refused
        self.running = 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    def busy_error(self) -> OpenAIError:
        return OpenAIError(
            429,
            f"the server is at its limit of {self.concurrent} requests in flight and {self.queued} waiting; "
            f"retry after {OPENAI_RETRY_AFTER_S} s (the frontend's --max-concurrent and --max-queued)",
            type="requests",  # OpenAI's own 429 shape
            code="rate_limit_exceeded",
        )

    def check_room(self) -> None:
        """Refuse early, before the body is read, when a request could neither run nor wait."""
        if self.running >= self.concurrent and len(self.waiters) >= self.queued:
            self.refused(QUEUE_FULL)
            raise self.busy_error()

    async def acquire(self) -> None:
        if self.running < self.concurrent and not self.waiters:
            self.running += 1
            return
        self.check_room()
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut  # release() hands its slot over: running stays counted
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot as the client left: pass it on
                self.release()
            elif fut in self.waiters:
                self.waiters.remove(fut)
            raise

    def hold(self, task: asyncio.Future) -> asyncio.Future:
        """Release the slot when `task` ends, even if cancelled before it ran (a `finally` would not run then)."""
        task.add_done_callback(lambda _: self.release())
        return task

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1


def retry_after_headers() -> dict[str, str]:
    return {"Retry-After": str(OPENAI_RETRY_AFTER_S)}
