"""An OpenAI-compatible HTTP frontend (FastAPI on uvicorn) over a served repository's models via Triton's gRPC
streaming API: `/v1/models`, `/v1/completions`, `/v1/chat/completions` and `/metrics` in vLLM's names. This module
is the app and its routes. Text is detokenized here with the target's tokenizer, so both models stream the same text.

Triton's own OpenAI frontend does not fit (upstream-facts: triton-openai-frontend-limits).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations at runtime.

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from ...errors import TrtSpecError
from ...in_triton.serving import SHUTTING_DOWN, StopCutter, input_byte_limit
from ...records.names import SPECULATIVE
from .guard import (
    TOO_LARGE,
    Admission,
    ApiKeyGuard,
    Limits,
    SendTimeout,
    read_body,
    retry_after_headers,
)
from .llmapi import TextDeltas, completion_tokens, finish_reason, llmapi_tensors
from .metrics import (
    LLMAPI_NOTE_KEY,
    SPEC_DECODE_KEY,
    FrontendMetricsExporter,
    llmapi_speculative_decoding,
    speculative_decoding,
)
from .process import FrontendProcess, frontend_argv  # noqa: F401 - importable from here (cli, demo)
from .requests import (
    FrontendSettings,
    GenRequest,
    OpenAIError,
    model_not_found,
    parse_request,
    request_tensors,
)
from .schema import openapi_document
from .triton import TritonCallError, TritonModels


@dataclass
class Completion:
    text: str = ""
    tokens: int = 0
    finish_reason: str = "stop"
    spec: Optional[dict] = None  # vLLM's metrics.speculative_decoding; None: the baseline
    note: Optional[str] = None  # runtime llmapi: why the counts say nothing


class Frontend:
    """The app's state: settings, tokenizer, the Triton channel, and the vLLM-named metrics."""

    def __init__(self, settings: FrontendSettings, tokenizer=None, limits: Optional[Limits] = None):
        from ...in_triton.serving import load_tokenizer

        self.s = settings
        self.limits = limits or Limits()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(settings.tokenizer_dir)
        input_byte_limit(self.tokenizer, settings.prompt_limit)  # pay its one-time cost at start
        self.created = int(time.time())
        self.models: Optional[TritonModels] = None
        self.metrics = FrontendMetricsExporter()
        self.admission = Admission(self.limits.max_concurrent, self.limits.max_queued, self.metrics.refused)
        self.metrics.watch_admission(self.admission)
        self.stopping = False  # a request admitted after this gets STOPPED
        self.live: dict[asyncio.Future, Optional[asyncio.Queue]] = {}  # running call -> its stream's queue

    def track(self, task: asyncio.Future, q: Optional[asyncio.Queue] = None) -> asyncio.Future:
        self.live[task] = q
        task.add_done_callback(lambda t: self.live.pop(t, None))
        return task

    def end_calls(self) -> None:
        """End every call still running with STOPPED and cancel its Triton call."""
        for task, q in list(self.live.items()):
            if q is not None:
                q.put_nowait(_sse(STOPPED.body()))
                q.put_nowait("data: [DONE]\n\n")
                q.put_nowait(None)
            task.cancel()

    async def run(self, r: GenRequest) -> AsyncIterator[tuple[str, Completion]]:
        """(text delta, completion so far) per model response; the last item carries the finish reason."""
        from ...in_triton.serving import IncrementalDetokenizer

        if self.s.llmapi:
            async for item in self._run_llmapi(r):
                yield item
            return

        detok = IncrementalDetokenizer(self.tokenizer)
        cut = StopCutter(r.stop)
        done = Completion()
        t0 = time.perf_counter()
        last = None
        self.metrics.running(r.model, +1)
        try:
            outputs: Optional[dict] = {} if r.model == SPECULATIVE else None  # the BLS's metric outputs
            gen = self.models.generate(r.model, request_tensors(r), outputs)
            try:
                async for ids in gen:
                    if not ids:
                        continue
                    now = time.perf_counter()
                    self.metrics.token_times(
                        r.model,
                        now - t0 if last is None else None,
                        None if last is None else (now - last) / len(ids),
                        len(ids),
                    )
                    last = now
                    done.tokens += len(ids)
                    delta = cut.add(detok.add(ids))
                    done.text += delta
                    if delta:
                        yield delta, done
                    if cut.stopped:
                        break
            finally:
                await gen.aclose()
            tail = "" if cut.stopped else cut.add(detok.flush()) + cut.flush()
            done.text += tail
            done.finish_reason = "length" if done.tokens >= r.max_tokens and not cut.stopped else "stop"
            done.spec = speculative_decoding(outputs) if outputs is not None else None
            self.metrics.finished(r.model, r.prompt_tokens, done.tokens, time.perf_counter() - t0)
            yield tail, done
        finally:
            self.metrics.running(r.model, -1)

    async def _run_llmapi(self, r: GenRequest) -> AsyncIterator[tuple[str, Completion]]:
        """run() for the LLM-API model. It returns no ids, so tokens are counted at the end and the inter-token
        latency is the request's mean gap, observed once per token after the first."""
        deltas = TextDeltas(r.stop)
        done, outputs = Completion(), {}
        t0 = time.perf_counter()
        first = last = None
        ended = False
        self.metrics.running(r.model, +1)
        try:
            gen = self.models.generate_text(r.model, llmapi_tensors(r, self.s), outputs)
            try:
                async for whole in gen:
                    delta = deltas.add(whole)
                    if delta:
                        last = time.perf_counter()
                        if first is None:
                            first = last
                            self.metrics.token_times(r.model, first - t0, None, 0)
                        done.text += delta
                        yield delta, done
                    if deltas.stopped:
                        break
                else:
                    ended = True
            finally:
                await gen.aclose()
            tail = deltas.flush()
            done.text += tail
            retokenized = len(self.tokenizer.encode(done.text, add_special_tokens=False))
            done.finish_reason = finish_reason(outputs.get("finish_reason"), retokenized, r, deltas.stopped)
            done.tokens = completion_tokens(retokenized, done.finish_reason, r)
            if first is not None and done.tokens > 1:
                self.metrics.token_times(r.model, None, (last - first) / (done.tokens - 1), done.tokens - 1)
            # as vLLM: no `metrics` without speculation; none for a call cut before its end either
            if self.s.speculative_config and ended:
                done.spec, done.note = llmapi_speculative_decoding(outputs)
            self.metrics.finished(r.model, r.prompt_tokens, done.tokens, time.perf_counter() - t0)
            yield tail, done
        finally:
            self.metrics.running(r.model, -1)


def _usage(r: GenRequest, c: Completion) -> dict:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": c.tokens, "total_tokens": r.prompt_tokens + c.tokens}


def _with_metrics(body: dict, c: Completion) -> dict:
    """The body with vLLM's top-level `metrics` object when the model reported acceptance."""
    if c.spec is None:
        return body
    return {**body, "metrics": {SPEC_DECODE_KEY: c.spec, **({LLMAPI_NOTE_KEY: c.note} if c.note else {})}}


def _chunk(
    r: GenRequest, rid: str, created: int, delta: Optional[str], finish: Optional[str], role: bool = False
) -> dict:
    if r.chat:
        d: dict = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
        choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": r.model, "choices": [choice]}
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": r.model,
        "choices": [{"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}],
    }


def _completion(r: GenRequest, rid: str, c: Completion) -> dict:
    if r.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": int(time.time()), "model": r.model, "choices": [choice]}
    return _with_metrics({**body, "usage": _usage(r, c)}, c)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _error(e: OpenAIError):
    from fastapi.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status, headers=retry_after_headers() if e.status == 429 else None)


async def _disconnected(request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


class _ClientGone(TrtSpecError):
    pass


# a call still running when the frontend stops: a 503, which OpenAI's SDK retries and a load balancer sends elsewhere
STOPPED = OpenAIError(
    503,
    f"{SHUTTING_DOWN}: the request was still running when the server stopped; retry it",
    type="server_error",
)


async def _unless_gone(request, work):
    """The result of `work`, or _ClientGone (`work` cancelled) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        finished, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task not in finished:
        task.cancel()
        raise _ClientGone()
    return task.result()


async def _collect(fe: Frontend, r: GenRequest) -> Completion:
    c = Completion()
    try:
        async for _, c in fe.run(r):
            pass
    except TritonCallError as e:
        raise OpenAIError(e.status, str(e), type="invalid_request_error" if e.status == 400 else "server_error")
    return c


async def _produce(fe: Frontend, r: GenRequest, rid: str, q: asyncio.Queue) -> None:
    """Generate a streamed answer into `q` (None ends it) at the model's pace, so a client that stops reading holds
    no admission slot."""
    try:
        async for event in _stream(fe, r, rid):
            q.put_nowait(event)
    except Exception as e:  # noqa: BLE001 - the status is sent already: the error goes in the stream
        print(f"trt-spec openai: stream {rid} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        err = OpenAIError(
            500, f"internal error ({type(e).__name__}); the frontend's log has the details", type="internal_error"
        )
        q.put_nowait(_sse(err.body()))
        q.put_nowait("data: [DONE]\n\n")
    finally:
        q.put_nowait(None)


async def _drain(q: asyncio.Queue):
    while (event := await q.get()) is not None:
        yield event


def _streaming_response(fe: Frontend, r: GenRequest, rid: str):
    """The SSE response; its producer (and Triton call) is cancelled when the response ends early."""
    from fastapi.responses import StreamingResponse

    q: asyncio.Queue = asyncio.Queue()
    producer = fe.track(fe.admission.hold(asyncio.ensure_future(_produce(fe, r, rid, q))), q)

    class _Owned(StreamingResponse):
        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                producer.cancel()

    return _Owned(_drain(q), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _stream(fe: Frontend, r: GenRequest, rid: str):
    created = int(time.time())
    c = Completion()
    try:
        if r.chat:
            yield _sse(_chunk(r, rid, created, None, None, role=True))
        async for delta, c in fe.run(r):
            if delta:
                yield _sse(_chunk(r, rid, created, delta, None))
        yield _sse(_chunk(r, rid, created, None, c.finish_reason))
        if r.include_usage:
            obj = "chat.completion.chunk" if r.chat else "text_completion"
            body = {"id": rid, "object": obj, "created": created, "model": r.model, "choices": []}
            yield _sse(_with_metrics({**body, "usage": _usage(r, c)}, c))  # vLLM: metrics ride the usage chunk
    except TritonCallError as e:  # the status is sent already
        yield _sse(
            OpenAIError(e.status, str(e), type="server_error" if e.status >= 500 else "invalid_request_error").body()
        )
    yield "data: [DONE]\n\n"


async def _complete(fe: Frontend, request, chat: bool):
    """One completion request: checked (room first, then the body), admitted or 429, then streamed or whole."""
    from fastapi.responses import Response

    try:
        fe.admission.check_room()
        r = parse_request(await read_body(request, fe.limits.max_body_bytes), fe.tokenizer, fe.s, chat=chat)
        await _unless_gone(request, fe.admission.acquire())
        if fe.stopping:  # the client goes to another replica
            fe.admission.release()
            raise STOPPED
    except OpenAIError as e:
        if e.status == 413:
            fe.metrics.refused(TOO_LARGE)
        return _error(e)
    except _ClientGone:
        return Response(status_code=499)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    if r.stream:
        return _streaming_response(fe, r, rid)
    try:
        c = await _unless_gone(request, fe.track(fe.admission.hold(asyncio.ensure_future(_collect(fe, r)))))
    except _ClientGone:
        return Response(status_code=499)
    except OpenAIError as e:
        return _error(e)
    except asyncio.CancelledError:  # the work, not this handler, was cancelled (end_calls)
        if not fe.stopping:
            raise
        return _error(STOPPED)
    return _completion(r, rid, c)


def _add_error_handlers(app) -> None:
    """Every error as OpenAI's error JSON."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return _error(OpenAIError(exc.status_code, str(exc.detail), type="invalid_request_error"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return _error(OpenAIError(400, str(exc)))

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        return _error(
            OpenAIError(
                500, f"internal error ({type(exc).__name__}); the frontend's log has the details", type="internal_error"
            )
        )


def _add_routes(app, fe: Frontend) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response

    models_served = fe.s.models

    @app.get("/health")
    async def health():
        ok = await fe.models.ready()
        return JSONResponse({"status": "ok" if ok else "triton unavailable"}, status_code=200 if ok else 503)

    document = openapi_document(fe.s, keyed=bool(fe.limits.api_key))

    @app.get("/openapi.json")
    async def openapi():
        return document

    @app.get("/metrics")
    async def metrics():
        return Response(fe.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": fe.created, "owned_by": "trt-spec"} for m in models_served
            ],
        }

    @app.get("/v1/models/{model}")
    async def model(model: str):
        if model not in models_served:
            return _error(
                model_not_found(model, fe.s)
                or OpenAIError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")
            )
        return {"id": model, "object": "model", "created": fe.created, "owned_by": "trt-spec"}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(fe, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(fe, request, chat=True)


def create_app(
    settings: FrontendSettings, tokenizer=None, api_key: Optional[str] = None, limits: Optional[Limits] = None
):
    """The ASGI app with its guards; `api_key` overrides limits.api_key (neither: no key asked for)."""
    import dataclasses
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    limits = limits or Limits()
    if api_key is not None:
        limits = dataclasses.replace(limits, api_key=api_key)
    fe = Frontend(settings, tokenizer, limits)

    @asynccontextmanager
    async def lifespan(app):
        fe.models = TritonModels(settings.triton_url)
        yield
        await fe.models.close()

    app = FastAPI(
        title="trt-spec OpenAI-compatible frontend", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.frontend = fe
    _add_error_handlers(app)
    _add_routes(app, fe)
    if fe.limits.api_key:
        app.add_middleware(ApiKeyGuard, key=fe.limits.api_key, refused=fe.metrics.refused)
    app.add_middleware(SendTimeout, seconds=fe.limits.send_timeout_s, abandoned=fe.metrics.abandoned)  # outermost
    return app


def main(argv: Optional[list[str]] = None) -> int:
    """python -m trt_spec.serve.openai.frontend --repository REPO --triton HOST:GRPC_PORT --port P [--host H]
    [--api-key-file FILE] [--max-concurrent N] [--max-queued N] [--max-body-bytes N]"""
    import argparse

    from ...records import defaults as d
    from ..launch import ServedRepository
    from .guard import read_api_key

    ap = argparse.ArgumentParser(prog="trt-spec-openai", description=main.__doc__)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--triton", required=True, help="Triton's gRPC endpoint, HOST:PORT")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument(
        "--api-key-file", help=f"the bearer key /v1/* asks for (its first line); else ${d.OPENAI_API_KEY_ENV}"
    )
    ap.add_argument("--max-concurrent", type=int, default=d.OPENAI_MAX_CONCURRENT, help="requests in Triton at once")
    ap.add_argument("--max-queued", type=int, default=d.OPENAI_MAX_QUEUED, help="requests waiting; then 429")
    ap.add_argument("--max-body-bytes", type=int, default=d.OPENAI_MAX_BODY_BYTES, help="request body cap; then 413")
    a = ap.parse_args(argv)
    try:
        key = read_api_key(a.api_key_file)
        limits = Limits(
            max_body_bytes=a.max_body_bytes, max_concurrent=a.max_concurrent, max_queued=a.max_queued, api_key=key
        )
        settings = FrontendSettings.from_repository(ServedRepository.load(Path(a.repository)), a.triton)
    except (TrtSpecError, ValueError) as e:  # ValueError: Limits
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"trt-spec OpenAI frontend on http://{a.host}:{a.port} (Triton gRPC {a.triton}); API key: "
        f"{'required' if key else 'none'}; limits: {limits.max_concurrent} requests in flight, {limits.max_queued} "
        f"waiting, {limits.max_body_bytes} body bytes",
        file=sys.stderr,
        flush=True,
    )
    _serve(create_app(settings, limits=limits), a.host, a.port, limits)
    return 0


def _serve(app, host: str, port: int, limits: Limits) -> None:
    """uvicorn with its limits explicit. limit_concurrency sits above the frontend's own admission, so the 429
    answers a flood first; timeout_graceful_shutdown keeps a stuck stream from blocking exit forever."""
    import uvicorn

    from ...records import defaults as d

    fe: Frontend = app.state.frontend

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            """No new work; calls still open get OPENAI_STOP_GRACE_S, then STOPPED."""
            fe.stopping = True
            asyncio.get_running_loop().call_later(d.OPENAI_STOP_GRACE_S, fe.end_calls)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        limit_concurrency=max(d.OPENAI_CONNECTION_LIMIT, 2 * (limits.max_concurrent + limits.max_queued)),
        timeout_keep_alive=d.OPENAI_KEEP_ALIVE_S,
        timeout_graceful_shutdown=d.DRAIN_TIMEOUT_S,
    )
    Server(config).run()


if __name__ == "__main__":
    raise SystemExit(main())
