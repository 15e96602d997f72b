"""The OpenAI frontend's own guards (serve/openai/guard.py): its API key, its bounds (all before any tokenizing), its
body cap, its admission (429 + Retry-After, a slot freed when generation ends or the client leaves) and its send
timeout. The app is the real one; only Triton is replaced, by an in-process async model that yields token ids (the
e2e tests, tests/e2e/test_openai.py, run the real server). Admission and slow readers run on a real uvicorn socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest

from trt_spec.records.names import SPECULATIVE
from trt_spec.serve.openai.frontend import create_app
from trt_spec.serve.openai.guard import Admission, Limits, read_api_key
from trt_spec.serve.openai.requests import FrontendSettings, OpenAIError

S = FrontendSettings("127.0.0.1:1", "tok", max_seq_len=1 << 20, max_draft_len=4)
SMALL = FrontendSettings("127.0.0.1:1", "tok", max_seq_len=4096, max_draft_len=4)  # prompts of <= 4096 tokens
KEY = "sk-test-0123456789"


class Tok:
    """One token per character; token i decodes to `width` copies of a letter (wide tokens make big streams cheap)."""

    chat_template = "x"

    def __init__(self, width: int = 1, refuse: bool = False):
        self.width, self.refuse, self.calls = width, refuse, 0

    def __len__(self):
        return 26

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) * self.width for i in ids)

    def encode(self, text, add_special_tokens=True):
        self.calls += 1
        if self.refuse:
            raise AssertionError("the tokenizer was called")
        return [1] * len(text)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        self.calls += 1
        if self.refuse:
            raise AssertionError("the chat template was rendered")
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeTriton:
    """Triton's part of the frontend (openai_triton.TritonModels' generate/ready/close): `responses` responses of
    `per` token ids each, one every `gap` s, and not past `gate` until it is set. Counts calls ended and cancelled."""

    def __init__(self, responses=3, per=1, gap=0.0, gate: threading.Event | None = None):
        self.responses, self.per, self.gap, self.gate = responses, per, gap, gate
        self.started = self.finished = self.cancelled = 0

    async def generate(self, model, tensors, metrics=None):
        self.started += 1
        try:
            for i in range(self.responses):
                while self.gate is not None and not self.gate.is_set():
                    await asyncio.sleep(0.01)
                await asyncio.sleep(self.gap)
                yield [i % 26] * self.per
            self.finished += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    async def ready(self):
        return True

    async def close(self):
        pass


def app_with(triton=None, tok=None, settings=S, api_key=None, **limits):
    app = create_app(settings, tok or Tok(), api_key=api_key, limits=Limits(**limits))
    app.state.frontend.models = triton or FakeTriton()
    return app


def client(app):
    from fastapi.testclient import TestClient

    return TestClient(app, raise_server_exceptions=False)


def completion(**extra):
    return {"model": SPECULATIVE, "prompt": "hi", "max_tokens": 3, **extra}


# -- Keys ------------------------------------------------------------------------------------------------------


def test_the_key_guards_every_v1_route_and_leaves_health_and_metrics_open():
    c = client(app_with(api_key=KEY))
    for method, path, body in (
        ("GET", "/v1/models", None),
        ("GET", f"/v1/models/{SPECULATIVE}", None),
        ("POST", "/v1/completions", completion()),
        ("POST", "/v1/chat/completions", {"model": SPECULATIVE, "messages": [{"role": "user", "content": "hi"}]}),
    ):
        missing = c.request(method, path, json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert missing.json()["error"]["message"].startswith("missing bearer token")
        wrong = c.request(method, path, json=body, headers={"Authorization": "Bearer sk-wrong-guess"})
        assert wrong.status_code == 401 and wrong.json()["error"]["message"].startswith("incorrect API key")
        assert "sk-wrong-guess" not in wrong.text and KEY not in wrong.text  # neither key echoed
        right = c.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
        assert right.status_code == 200, right.text
    assert c.get("/v1/models", headers={"Authorization": KEY}).status_code == 401  # no scheme: not a bearer token
    assert c.get("/health").status_code == 200
    metrics = c.get("/metrics")
    assert (
        metrics.status_code == 200
        and 'trt_spec_openai_requests_refused_total{reason="unauthorized"} 9.0' in metrics.text
    )
    assert client(app_with()).get("/v1/models").status_code == 200  # no key configured: open


def test_the_key_comes_from_its_file_or_the_environment(tmp_path):
    f = tmp_path / "key"
    f.write_text(f"  {KEY}  \nsecond line ignored\n")
    assert read_api_key(f, {}) == KEY
    assert read_api_key(None, {"TRT_SPEC_OPENAI_API_KEY": "from-env"}) == "from-env"
    assert read_api_key(None, {}) is None
    f.write_text("\n")
    with pytest.raises(ValueError, match="first line is empty"):
        read_api_key(f, {})
    with pytest.raises(ValueError, match="cannot be read"):
        read_api_key(tmp_path / "absent", {})
    assert KEY not in repr(Limits(api_key=KEY))


def test_frontend_cli_refuses_an_empty_key_file_in_one_line(tmp_path, capsys):
    from trt_spec.serve.openai.frontend import main

    f = tmp_path / "key"
    f.write_text("")
    argv = ["--repository", str(tmp_path), "--triton", "127.0.0.1:1", "--port", "1", "--api-key-file", str(f)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "first line is empty" in err and len(err.strip().splitlines()) == 1
    assert main(argv[:-1] + [str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "absent: cannot be read" in err and len(err.strip().splitlines()) == 1


def test_frontend_argv_passes_only_the_options_given(tmp_path):
    from trt_spec.serve.openai.process import frontend_argv

    plain = frontend_argv(tmp_path, "h:1", 9000, "127.0.0.1")
    assert "--api-key-file" not in plain and "--max-concurrent" not in plain
    argv = frontend_argv(tmp_path, "h:1", 9000, "127.0.0.1", api_key_file=tmp_path / "k", max_queued=8)
    assert argv[-4:] == ["--api-key-file", str(tmp_path / "k"), "--max-queued", "8"]


# -- Bounds, all before any tokenizing ---------------------------------------------------------------------------


def chat(messages, **extra):
    return {"model": SPECULATIVE, "messages": messages, **extra}


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "path,body,words",
    [
        ("chat", chat([USER] * 1025), "'messages' has 1025 messages; this server takes at most 1024"),
        ("chat", chat([USER, {"role": "user", "content": "x" * 100_000}]), "the messages' text is over"),
        ("chat", chat([{"role": "user", "content": [{"type": "text", "text": "a"}] * 1025}]), "at most 1024 per"),
        ("chat", chat([USER], max_completion_tokens=10**12), "'max_completion_tokens' 1000000000000 exceeds"),
        ("completions", completion(max_tokens=10**12), "'max_tokens' 1000000000000 exceeds this deployment's context"),
        ("completions", completion(metadata={f"k{i}": "v" for i in range(17)}), "at most 16 keys"),
        ("completions", completion(metadata={"k": "v" * 513}), "values strings of at most 512"),
        ("completions", completion(logit_bias={str(i): 1 for i in range(60_000)}), "'logit_bias' is not supported"),
        ("completions", completion(stop=["a"] * 5), "up to 4 non-empty strings"),
        ("completions", completion(n=2), "'n' must be 1"),
        ("completions", "[" * 100_000, "nested deeper than the frontend parses"),
        ("completions", "{not json", "not valid JSON"),
    ],
)
def test_each_bound_is_a_400_naming_it_before_any_tokenizing(path, body, words):
    tok = Tok(refuse=True)
    c = client(app_with(tok=tok, settings=SMALL))
    data = body if isinstance(body, str) else json.dumps(body)
    t0 = time.perf_counter()
    r = c.post(f"/v1/{'chat/' if path == 'chat' else ''}completions", content=data)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert tok.calls == 0 and time.perf_counter() - t0 < 2.0


def test_non_finite_numbers_are_refused():
    c = client(app_with())
    r = c.post("/v1/completions", content=json.dumps(completion()).replace('"max_tokens": 3', '"temperature": NaN'))
    assert r.status_code == 400 and "'temperature' must be a number" in r.json()["error"]["message"]


def run_asgi(app, headers, chunks):
    """One POST straight through the ASGI app: (status, body, how many times the app asked for the body)."""
    asked, sent = [0], []

    async def receive():
        asked[0] += 1
        return next(chunks, {"type": "http.disconnect"})

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "scheme": "http",
        "root_path": "",
    }
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body), asked[0]


def test_a_body_over_the_cap_is_refused_on_content_length_without_reading_it():
    endless = iter(lambda: {"type": "http.request", "body": b"x" * 65536, "more_body": True}, None)
    app = app_with(max_body_bytes=4096)
    status, body, asked = run_asgi(app, [(b"content-length", b"1000000000")], endless)
    assert status == 413 and asked == 0
    assert b'trt_spec_openai_requests_refused_total{reason="too_large"} 1.0' in app.state.frontend.metrics.exposition()
    assert "1000000000 bytes; this server takes at most 4096 bytes (the frontend's --max-body-bytes)" in str(body)


def test_a_chunked_body_over_the_cap_is_refused_while_reading():
    endless = iter(lambda: {"type": "http.request", "body": b"x" * 1024, "more_body": True}, None)
    status, body, asked = run_asgi(app_with(max_body_bytes=4096), [], endless)
    assert status == 413 and asked == 5 and body["error"]["code"] == "request_too_large"


# -- Admission, unit --------------------------------------------------------------------------------------------


def test_admission_waits_in_order_gives_up_a_place_when_cancelled_and_refuses_beyond_the_queue():
    async def scenario():
        a = Admission(1, 2)
        await a.acquire()  # running
        order = []

        async def waiter(name):
            await a.acquire()
            order.append(name)

        w1, w2 = asyncio.ensure_future(waiter(1)), asyncio.ensure_future(waiter(2))
        await asyncio.sleep(0)
        assert a.waiting == 2
        with pytest.raises(OpenAIError) as e:
            await a.acquire()
        assert e.value.status == 429 and "limit of 1 requests in flight and 2 waiting; retry after 1 s" in str(e.value)
        w1.cancel()  # a client gone while queued
        await asyncio.sleep(0)
        assert a.waiting == 1
        w3 = asyncio.ensure_future(waiter(3))
        await asyncio.sleep(0)
        a.release()
        await asyncio.sleep(0)
        assert order == [2] and a.running == 1
        a.release()
        await w3
        a.release()
        assert order == [2, 3] and (a.running, a.waiting) == (0, 0)
        await asyncio.gather(w1, w2, return_exceptions=True)

    asyncio.run(scenario())


# -- Admission and slow readers on a real socket ----------------------------------------------------------------


@contextlib.contextmanager
def served(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.frontend
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def raw_stream(url, body, rcvbuf=None) -> socket.socket:
    """A streamed request sent on a plain socket, whose answer is left unread (a tiny receive buffer: it fills)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    data = json.dumps({**body, "stream": True}).encode()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return s


def until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def metric(url, name):
    import httpx

    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_full_server_answers_429_with_retry_after_and_the_queue_drains_in_order():
    import httpx

    gate = threading.Event()
    triton = FakeTriton(gate=gate)
    with served(app_with(triton, max_concurrent=1, max_queued=1)) as (url, fe):
        with httpx.Client(timeout=10) as h, contextlib.ExitStack() as stack:
            first = stack.enter_context(h.stream("POST", f"{url}/v1/completions", json=completion(stream=True)))
            assert first.status_code == 200
            until(lambda: triton.started == 1)
            results = []
            queued = threading.Thread(
                target=lambda: results.append(httpx.post(f"{url}/v1/completions", json=completion()))
            )
            queued.start()
            until(lambda: fe.admission.waiting == 1)
            full = h.post(f"{url}/v1/completions", json=completion())
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert "limit of 1 requests in flight and 1 waiting" in full.json()["error"]["message"]
            assert (full.json()["error"]["type"], full.json()["error"]["code"]) == ("requests", "rate_limit_exceeded")
            assert metric(url, "trt_spec_openai_requests_waiting") == 1.0
            gate.set()
            assert "data: [DONE]" in "".join(first.iter_text())
            queued.join(10)
            assert results[0].status_code == 200 and results[0].json()["choices"][0]["text"] == "abc"
        assert metric(url, 'trt_spec_openai_requests_refused_total{reason="queue_full"}') == 1.0
        assert (fe.admission.running, fe.admission.waiting) == (0, 0)


def test_a_slot_is_freed_when_generation_ends_though_the_stream_is_unread_and_the_reader_is_dropped_later():
    import httpx

    # ~16 MB of SSE: far more than the socket buffers hold, so the server's sends block on the unread stream
    triton = FakeTriton(responses=40, per=100)
    with served(app_with(triton, tok=Tok(width=4096), max_concurrent=1, max_queued=0, send_timeout_s=1.0)) as (url, fe):
        stuck = raw_stream(url, completion(max_tokens=4000), rcvbuf=4096)
        try:
            until(lambda: triton.finished == 1)  # generated in full, nothing read
            until(lambda: fe.admission.running == 0)
            ok = httpx.post(f"{url}/v1/completions", json=completion(), timeout=10)
            assert ok.status_code == 200  # the slot is free for the next request
            until(lambda: metric(url, "trt_spec_openai_streams_abandoned_total") == 1.0)  # the send timeout
        finally:
            stuck.close()


def test_a_slot_is_freed_and_the_triton_call_cancelled_when_the_client_leaves():
    import httpx

    triton = FakeTriton(responses=10_000, gap=0.02)
    with served(app_with(triton, max_concurrent=1, max_queued=1)) as (url, fe):
        with httpx.Client(timeout=10) as h:
            with h.stream("POST", f"{url}/v1/completions", json=completion(max_tokens=10_000, stream=True)) as r:
                next(r.iter_lines())
        until(lambda: triton.cancelled == 1 and fe.admission.running == 0)
        # a queued client that leaves gives up its place
        busy = raw_stream(url, completion(max_tokens=10_000))
        until(lambda: fe.admission.running == 1)
        leaver = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        data = json.dumps(completion()).encode()
        leaver.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        leaver.sendall(f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        until(lambda: fe.admission.waiting == 1)
        leaver.close()
        until(lambda: fe.admission.waiting == 0)
        busy.close()
        until(lambda: fe.admission.running == 0 and triton.cancelled == 2)
