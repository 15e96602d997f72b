"""An OpenAI-compatible HTTP frontend over a served trt-spec repository: `/v1/models`, `/v1/completions`,
`/v1/chat/completions` (SSE streaming, usage), and `/metrics` in vLLM's names.

A thin async adapter: FastAPI on uvicorn for HTTP, and Triton's gRPC streaming API (tritonclient's protobuf service
stubs over grpc.aio) for the models. The two model names are the repository's: `ensemble` (the baseline) and
`tensorrt_llm_bls` (speculative decoding). A request becomes one KServe request to that model with the text models'
tensors (records/names.py); the answer's text is detokenized here from the output ids, incrementally, with the
target's tokenizer (the one the repository's models use), so both models stream the same text for the same tokens.

Why not Triton's own OpenAI frontend (server `python/openai/`, shipped in the NGC images): it starts its own
in-process tritonserver instead of reaching a running one, it sends `return_num_input_tokens` /
`return_num_output_tokens` inputs that trt-spec's text models (and NVIDIA's ensemble) do not declare, and its
request schemas forbid extra fields (`ConfigDict(extra="forbid")`), so the speculation knobs `num_draft_tokens` and
`draft_len_policy` could not be sent (server r26.04, python/openai/openai_frontend/schemas/openai.py, engine/utils/
triton.py). The same frontend serves a CPU and a GPU deployment; it needs only the gRPC port.

Semantics (OpenAI's): temperature defaults to 1 (sampling, top_p 1); temperature 0 is greedy (the engine is then
sent no sampling input: TensorRT-LLM's greedy, backend_contract.effective_top_k_top_p). `stop` strings end the
generation (sent as stop words, and cut from the text, which never contains them); finish_reason is "length" when
max_tokens tokens came, else "stop". Errors are OpenAI's error JSON with its status codes.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import numpy as np

from ..records import backend_contract as bc
from ..records import names as n
from ..records.defaults import ADD_SPECIAL_TOKENS
from ..records.names import (BASELINE, DRAFT_LEN_POLICY, MAX_TOKENS, NUM_DRAFT_TOKENS, OUTPUT_IDS, SPECULATIVE,
                             STOP_WORDS, STREAM, TEXT_INPUT, TEXT_MODELS, TOP_P)
from ..records.speculation import POLICIES
from ..in_triton.serving import StopCutter, input_byte_limit

MAX_STOP_SEQUENCES = 4  # OpenAI's limit
# Request fields accepted and ignored (no effect on the output)
IGNORED_FIELDS = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
                  "safety_identifier"}
# Fields that change the output in ways this deployment does not serve: refused unless at their default
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "suffix": (None, ""), "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"),
               "response_format": (None, {"type": "text"}), "modalities": (None, ["text"]), "audio": (None,),
               "prediction": (None,), "reasoning_effort": (None,)}
COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options",
                 NUM_DRAFT_TOKENS, DRAFT_LEN_POLICY}


class OpenAIError(Exception):
    """One request's error, as OpenAI reports it: HTTP status and {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class FrontendSettings:
    """What the frontend needs from the repository it fronts (the BLS's own parameters)."""

    triton_url: str  # host:port of Triton's gRPC endpoint
    tokenizer_dir: str
    max_seq_len: int
    max_draft_len: int
    add_special_tokens: bool = ADD_SPECIAL_TOKENS
    models: tuple[str, ...] = TEXT_MODELS
    max_input_len: Optional[int] = None  # the deployment's prompt limit in tokens (None: max_seq_len)

    @property
    def prompt_limit(self) -> int:
        return self.max_input_len or self.max_seq_len

    @staticmethod
    def from_repository(repo: Path, triton_url: str) -> "FrontendSettings":
        from ..repository.writer import RepositoryError, parse_config

        path = Path(repo) / SPECULATIVE / "config.pbtxt"
        if not path.is_file():
            raise RepositoryError(f"{repo}: no {SPECULATIVE}/config.pbtxt: the OpenAI frontend serves the engine "
                                  "runtime's repository (ensemble and the speculative BLS), which `trt-spec repo` "
                                  "writes; a runtime llmapi repository is not served by it")
        p = {k: v.string_value for k, v in parse_config(path).parameters.items()}
        from ..in_triton.serving import repo_path

        return FrontendSettings(triton_url, repo_path(str(path.parent), p["tokenizer_dir"]), int(p["max_seq_len"]), int(p["max_draft_len"]),
                                p.get("add_special_tokens", "true") == "true",
                                max_input_len=int(p["max_input_len"]) if p.get("max_input_len") else None)


@dataclass
class GenRequest:
    """One validated OpenAI request, as the text models take it."""

    model: str
    chat: bool
    text: str  # the prompt as sent to the model (chat: rendered with the tokenizer's chat template)
    prompt_tokens: int
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    temperature: Optional[float] = 1.0  # None: greedy
    top_p: Optional[float] = None
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    num_draft_tokens: Optional[int] = None
    draft_len_policy: Optional[str] = None


def _number(body: dict, name: str, kind, lo=None, hi=None, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise OpenAIError(400, f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {v!r}",
                          param=name)
    v = kind(v)
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        rng = f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise OpenAIError(400, f"'{name}' must be in {rng}, got {v}", param=name)
    return v


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(400, f"messages[{i}].content: only text parts are served", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise OpenAIError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")


def parse_request(body: Any, tokenizer, s: FrontendSettings, *, chat: bool) -> GenRequest:
    """A request body -> GenRequest, or OpenAIError naming the field and the fix (before any model work)."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "'model' is required: one of " + ", ".join(s.models), param="model")
    if model not in s.models:
        raise OpenAIError(404, f"The model `{model}` does not exist; this server has {', '.join(s.models)} "
                               f"({BASELINE}: the baseline, {SPECULATIVE}: speculative decoding)",
                          param="model", code="model_not_found")
    allowed = COMMON_FIELDS | IGNORED_FIELDS | set(UNSUPPORTED) | (
        {"messages", "max_completion_tokens"} if chat else {"prompt"})
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise OpenAIError(400, f"unrecognized request argument: {unknown[0]!r}", param=unknown[0])
    for name, defaults in UNSUPPORTED.items():
        if name in body and body[name] not in defaults:
            raise OpenAIError(400, f"'{name}' is not supported by this deployment; omit it", param=name)
    choices = _number(body, "n", int)
    if choices not in (None, 1):
        raise OpenAIError(400, f"'n' must be 1 (one choice per request), got {choices}", param="n")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError(400, "'messages' must be a non-empty list of {role, content}", param="messages")
        conv = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
                raise OpenAIError(400, f"messages[{i}] needs a role of system, user or assistant", param="messages")
            role = "system" if m["role"] == "developer" else m["role"]
            conv.append({"role": role, "content": _text_content(m.get("content"), i)})
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(400, "the model's tokenizer has no chat template; use /v1/completions")
        text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise OpenAIError(400, "'prompt' must be a string (one prompt per request)", param="prompt")
        text = prompt
    if not text:
        raise OpenAIError(400, "the prompt is empty; send a non-empty prompt", param="messages" if chat else "prompt")
    byte_limit = input_byte_limit(tokenizer, s.prompt_limit)
    size = len(text.encode("utf-8"))
    if size > byte_limit:  # before tokenizing: 10 MB would take seconds and a GB to count
        raise OpenAIError(400, f"the prompt is {size} bytes: more than any text of at most {s.prompt_limit} tokens "
                               f"can be ({byte_limit} bytes); shorten it", param="messages" if chat else "prompt")
    prompt_tokens = len(tokenizer.encode(text, add_special_tokens=s.add_special_tokens))
    room = s.max_seq_len - prompt_tokens - s.max_draft_len  # what the engine can still generate (OUTPUT_LEN_CLAMPED)
    if room < 1:
        raise OpenAIError(400, f"the prompt is {prompt_tokens} tokens; this deployment takes at most "
                               f"{s.max_seq_len - s.max_draft_len - 1}; shorten it", param="prompt")
    limit = _number(body, "max_completion_tokens", int, 1) if chat else None
    limit = limit if limit is not None else _number(body, "max_tokens", int, 1)
    if limit is None:
        limit = room if chat else 16  # OpenAI: completions default to 16 tokens, chat to what the context leaves
    if limit > room:
        raise OpenAIError(400, f"max_tokens {limit} + the prompt's {prompt_tokens} tokens exceed this deployment's "
                               f"context ({s.max_seq_len}, less max_draft_len {s.max_draft_len}); ask for at most "
                               f"{room}", param="max_tokens")
    temperature = _number(body, "temperature", float, 0, 2)
    top_p = _number(body, "top_p", float, 0, 1, lo_open=True)
    seed = _number(body, "seed", int, 0, 2**64 - 1)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop)
                             or len(stop) > MAX_STOP_SEQUENCES):
        raise OpenAIError(400, f"'stop' must be a string or a list of up to {MAX_STOP_SEQUENCES} non-empty strings",
                          param="stop")
    if stop and sum(len(x.encode("utf-8")) for x in stop) > byte_limit:
        raise OpenAIError(400, f"'stop' is longer than any text of at most {s.prompt_limit} tokens can be "
                               f"({byte_limit} bytes); shorten it", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, "'stream' must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise OpenAIError(400, "'stream_options' is only allowed with stream: true", param="stream_options")
    k = _number(body, NUM_DRAFT_TOKENS, int, 0, s.max_draft_len)
    policy = body.get(DRAFT_LEN_POLICY)
    if (k is not None or policy is not None) and model != SPECULATIVE:
        name = NUM_DRAFT_TOKENS if k is not None else DRAFT_LEN_POLICY
        raise OpenAIError(400, f"'{name}' applies to the speculative model {SPECULATIVE}, not {model}", param=name)
    if policy is not None and policy not in POLICIES:
        raise OpenAIError(400, f"'{DRAFT_LEN_POLICY}' must be one of {', '.join(POLICIES)}", param=DRAFT_LEN_POLICY)
    greedy = temperature == 0.0
    return GenRequest(model, chat, text, prompt_tokens, limit, stream, bool((options or {}).get("include_usage")),
                      None if greedy else (1.0 if temperature is None else temperature),
                      None if greedy else (1.0 if top_p is None else top_p), seed, list(stop or []), k, policy)


def request_tensors(r: GenRequest) -> dict[str, np.ndarray]:
    """The text model's inputs for one request ([1, …]: the batch dimension first)."""
    t: dict[str, np.ndarray] = {
        TEXT_INPUT: np.array([[r.text.encode("utf-8")]], dtype=object),
        MAX_TOKENS: np.array([[r.max_tokens]], dtype=np.int32),
        STREAM: np.array([[r.stream]], dtype=bool),
        bc.EXCLUDE_INPUT_IN_OUTPUT: np.array([[True]], dtype=bool),
    }
    if r.temperature is not None:  # sampling: TensorRT-LLM samples only when top_k or top_p is set (top_p 1: all)
        t[bc.TEMPERATURE] = np.array([[r.temperature]], dtype=np.float32)
        t[TOP_P] = np.array([[r.top_p if r.top_p is not None else 1.0]], dtype=np.float32)
    if r.seed is not None:
        t[bc.SEED] = np.array([[r.seed]], dtype=np.uint64)
    if r.stop:
        t[STOP_WORDS] = np.array([[w.encode("utf-8") for w in r.stop]], dtype=object)
    if r.num_draft_tokens is not None:
        t[NUM_DRAFT_TOKENS] = np.array([[r.num_draft_tokens]], dtype=np.int32)
    if r.draft_len_policy is not None:
        t[DRAFT_LEN_POLICY] = np.array([[r.draft_len_policy.encode("utf-8")]], dtype=object)
    return t


class TritonCallError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _encode_input(name: str, arr: np.ndarray, request) -> None:
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    t = request.inputs.add()
    t.name, t.datatype = name, np_to_triton_dtype(arr.dtype) if arr.dtype != object else "BYTES"
    t.shape.extend(arr.shape)
    if arr.dtype == object:  # BYTES: each element length-prefixed (tritonclient's own encoding)
        serialized = serialize_byte_tensor(arr)
        request.raw_input_contents.append(serialized.item() if serialized.size > 0 else b"")
    else:
        request.raw_input_contents.append(arr.tobytes())


class TritonModels:
    """Requests to the text models over one gRPC channel (Triton's bidirectional stream, one call per request)."""

    def __init__(self, url: str):
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.url = url
        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", 2**31 - 1),
                                                               ("grpc.max_send_message_length", 2**31 - 1)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def ready(self) -> bool:
        from tritonclient.grpc import service_pb2

        try:
            return (await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5)).ready
        except Exception:  # noqa: BLE001 - unreachable is not ready
            return False

    async def generate(self, model: str, tensors: dict[str, np.ndarray]) -> AsyncIterator[list[int]]:
        """New token ids per response until the final one. Closing the iterator early (a client gone, a stop string
        seen) cancels the call: Triton then cancels the request in the model (the BLS stops between rounds, the
        engine between iterations)."""
        import grpc
        from tritonclient.grpc import InferResult, service_pb2

        req = service_pb2.ModelInferRequest(model_name=model, id=uuid.uuid4().hex)
        for name, arr in tensors.items():
            _encode_input(name, arr, req)
        req.outputs.add(name=OUTPUT_IDS)
        req.parameters["triton_enable_empty_final_response"].bool_param = True  # the stream's end, always

        async def one():
            yield req

        call = self.stub.ModelStreamInfer(one())
        try:
            async for resp in call:
                if resp.error_message:
                    msg = resp.error_message.strip()
                    raise TritonCallError(msg, 500 if "internal error" in msg else 400)
                result = InferResult(resp.infer_response)
                ids = result.as_numpy(OUTPUT_IDS)
                yield [int(x) for x in ids.reshape(-1)] if ids is not None else []
                final = resp.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                raise asyncio.CancelledError() from None
            status = 503 if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 500
            raise TritonCallError(f"Triton at {self.url}: {e.details() or e.code().name}", status) from None
        finally:
            call.cancel()  # a no-op once the call is done


@dataclass
class Completion:
    text: str = ""
    tokens: int = 0
    finish_reason: str = "stop"


class Frontend:
    """The app's state: settings, tokenizer, the Triton channel, and the vLLM-named metrics."""

    def __init__(self, settings: FrontendSettings, tokenizer=None):
        from ..in_triton.serving import load_tokenizer

        self.s = settings
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(settings.tokenizer_dir)
        input_byte_limit(self.tokenizer, settings.prompt_limit)  # its one-time cost at start, not in a request
        self.created = int(time.time())
        self.models: Optional[TritonModels] = None
        self.metrics = FrontendMetrics()

    async def run(self, r: GenRequest) -> AsyncIterator[tuple[str, Completion]]:
        """(text delta, completion so far) per model response; the last item carries the finish reason."""
        from ..in_triton.serving import IncrementalDetokenizer

        detok = IncrementalDetokenizer(self.tokenizer)
        cut = StopCutter(r.stop)
        done = Completion()
        t0 = time.perf_counter()
        last = None
        self.metrics.running(r.model, +1)
        try:
            gen = self.models.generate(r.model, request_tensors(r))
            try:
                async for ids in gen:
                    if not ids:
                        continue
                    now = time.perf_counter()
                    self.metrics.token_times(r.model, now - t0 if last is None else None,
                                             None if last is None else (now - last) / len(ids), len(ids))
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
            self.metrics.finished(r.model, r.prompt_tokens, done.tokens, time.perf_counter() - t0)
            yield tail, done
        finally:
            self.metrics.running(r.model, -1)


FRONTEND_METRICS = (n.VLLM_TTFT, n.VLLM_ITL, n.VLLM_E2E, n.VLLM_PROMPT_TOKENS, n.VLLM_GENERATION_TOKENS,
                    n.VLLM_REQUEST_SUCCESS, n.VLLM_RUNNING)
LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                     40.0, 80.0)


class FrontendMetrics:
    """The frontend's Prometheus metrics (records/names.py: vLLM's names and labels model_name, engine): request
    latency as the client sees it. The speculation counters are the BLS's (Triton's metrics port, spec_metrics.py)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def counter(name, doc):  # prometheus_client adds the _total the exposition shows
            return Counter(name.removesuffix("_total"), doc, labels, registry=self.registry)

        def histogram(name, doc):
            return Histogram(name, doc, labels, registry=self.registry, buckets=LATENCY_BUCKETS_S)

        self.ttft = histogram(n.VLLM_TTFT, "Time to first token")
        self.itl = histogram(n.VLLM_ITL, "Inter-token latency")
        self.e2e = histogram(n.VLLM_E2E, "End-to-end request latency")
        self.prompt = counter(n.VLLM_PROMPT_TOKENS, "Prompt tokens")
        self.generation = counter(n.VLLM_GENERATION_TOKENS, "Generated tokens")
        self.requests = counter(n.VLLM_REQUEST_SUCCESS, "Finished requests")
        self.running_g = Gauge(n.VLLM_RUNNING, "Requests in flight", labels, registry=self.registry)

    def running(self, model: str, d: int) -> None:
        self.running_g.labels(model, "0").inc(d)

    def token_times(self, model: str, ttft: Optional[float], gap: Optional[float], tokens: int = 1) -> None:
        if ttft is not None:
            self.ttft.labels(model, "0").observe(ttft)
        if gap is not None:
            for _ in range(tokens):
                self.itl.labels(model, "0").observe(gap)

    def finished(self, model: str, prompt: int, tokens: int, seconds: float) -> None:
        self.prompt.labels(model, "0").inc(prompt)
        self.generation.labels(model, "0").inc(tokens)
        self.requests.labels(model, "0").inc()
        self.e2e.labels(model, "0").observe(seconds)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _usage(r: GenRequest, c: Completion) -> dict:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": c.tokens,
            "total_tokens": r.prompt_tokens + c.tokens}


def _chunk(r: GenRequest, rid: str, created: int, delta: Optional[str], finish: Optional[str],
           role: bool = False) -> dict:
    if r.chat:
        d: dict = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
        choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": r.model,
                "choices": [choice]}
    return {"id": rid, "object": "text_completion", "created": created, "model": r.model,
            "choices": [{"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}]}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(settings: FrontendSettings, tokenizer=None):
    """The ASGI app (FastAPI)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    fe = Frontend(settings, tokenizer)

    @asynccontextmanager
    async def lifespan(app):
        fe.models = TritonModels(settings.triton_url)
        yield
        await fe.models.close()

    app = FastAPI(title="trt-spec OpenAI-compatible frontend", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.frontend = fe

    def error(e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return error(OpenAIError(exc.status_code, str(exc.detail), type="invalid_request_error"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return error(OpenAIError(400, str(exc)))

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        return error(OpenAIError(500, f"internal error ({type(exc).__name__}); the frontend's log has the details",
                                 type="internal_error"))

    @app.get("/health")
    async def health():
        ok = await fe.models.ready()
        return JSONResponse({"status": "ok" if ok else "triton unavailable"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(fe.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": fe.created, "owned_by": "trt-spec"}
                                           for m in settings.models]}

    @app.get("/v1/models/{model}")
    async def model(model: str):
        if model not in settings.models:
            return error(OpenAIError(404, f"The model `{model}` does not exist", param="model",
                                     code="model_not_found"))
        return {"id": model, "object": "model", "created": fe.created, "owned_by": "trt-spec"}

    async def body_of(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise OpenAIError(400, "the request body is not valid JSON") from None

    async def complete(request: Request, chat: bool):
        try:
            r = parse_request(await body_of(request), fe.tokenizer, settings, chat=chat)
        except OpenAIError as e:
            return error(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if r.stream:
            return StreamingResponse(_stream(r, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        task = asyncio.ensure_future(_collect(r))
        watch = asyncio.ensure_future(_disconnected(request))
        finished, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in finished:  # the client left: cancel the work (the Triton call is cancelled on the way out)
            task.cancel()
            return Response(status_code=499)
        watch.cancel()
        try:
            c = task.result()
        except OpenAIError as e:
            return error(e)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
                      "finish_reason": c.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": int(time.time()), "model": r.model, "choices": [choice],
                "usage": _usage(r, c)}

    async def _disconnected(request: Request) -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)

    async def _collect(r: GenRequest) -> Completion:
        c = Completion()
        try:
            async for _, c in fe.run(r):
                pass
        except TritonCallError as e:
            raise OpenAIError(e.status, str(e), type="invalid_request_error" if e.status == 400 else "server_error")
        return c

    async def _stream(r: GenRequest, rid: str):
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
                yield _sse({"id": rid, "object": "chat.completion.chunk" if r.chat else "text_completion",
                            "created": created, "model": r.model, "choices": [], "usage": _usage(r, c)})
        except TritonCallError as e:  # mid-stream: the status is sent already; the error goes in the stream
            yield _sse(OpenAIError(e.status, str(e), type="server_error" if e.status >= 500 else
                                   "invalid_request_error").body())
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    return app


def frontend_argv(repo: Path, triton_url: str, port: int, host: str) -> list[str]:
    return [sys.executable, "-m", "trt_spec.serve.openai_frontend", "--repository", str(repo), "--triton", triton_url,
            "--port", str(port), "--host", host]


class FrontendProcess:
    """The frontend as a child process of `trt-spec serve` (it dies with the thread that started it), on host:port,
    in front of a running Triton's gRPC endpoint. start() -> wait_ready() -> stop()."""

    def __init__(self, repo: Path, triton_url: str, port: int, host: str, log_path: Path):
        from .server import check_port_free

        FrontendSettings.from_repository(repo, triton_url)  # a repository it cannot serve fails here, in one line
        check_port_free(host if host != "0.0.0.0" else "", port, "openai")
        self.argv = frontend_argv(repo, triton_url, port, host)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        self.log_path = Path(log_path)
        self.proc = None

    def start(self) -> "FrontendProcess":
        import signal
        import subprocess

        from ..records.procutil import die_with_parent

        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 60.0) -> "FrontendProcess":
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenAI frontend exited with code {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the OpenAI frontend was not ready at {self.url} within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: Optional[list[str]] = None) -> int:
    """python -m trt_spec.serve.openai_frontend --repository REPO --triton HOST:GRPC_PORT --port P [--host H]"""
    import argparse

    import uvicorn

    from ..repository.writer import RepositoryError

    ap = argparse.ArgumentParser(prog="trt-spec-openai", description=main.__doc__)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--triton", required=True, help="Triton's gRPC endpoint, HOST:PORT")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    a = ap.parse_args(argv)
    try:
        settings = FrontendSettings.from_repository(Path(a.repository), a.triton)
    except (RepositoryError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(settings), host=a.host, port=a.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
