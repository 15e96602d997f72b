"""Faults under the OpenAI frontend, with `trt-spec serve --openai-port` run as a user runs it and the official
`openai` SDK as the client: tritonserver killed or a model's stub killed while OpenAI streams run -> each stream ends
with an OpenAI-shaped error within seconds (not a hang) and serve exits as it documents (1, 3); SIGTERM drains OpenAI
streams as it drains KServe ones (all whole, /health 503, a new request a 503 naming the shutdown, exit 0); the
frontend killed alone -> serve stops with one line and exit 1."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from trt_spec.records.names import BASELINE, SPECULATIVE  # noqa: E402

from ..farm import ServeProcess, refused  # noqa: E402

ERROR_WITHIN_S = 10.0  # a stream whose server died ends with an error within this: seconds, not a client timeout


class OpenAIServe(ServeProcess):
    """`trt-spec serve --openai-port`, ready once its ready line names the OpenAI endpoint."""

    def health(self) -> int:
        """The frontend's /health status; 0 when nothing answers."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return 0

    def pid(self, *words: str) -> int:
        found = [pid for pid, argv in self.procs().items() if all(any(w in a for a in argv) for w in words)]
        assert len(found) == 1, (words, self.procs())
        return found[0]


@pytest.fixture
def serve(farm, tmp_path):
    started: list[OpenAIServe] = []

    def start(*extra: str) -> OpenAIServe:
        repo = farm.copy_repo("dtm", tmp_path / f"repo{len(started)}")
        s = OpenAIServe(repo, tmp_path / f"serve{len(started)}", *extra, openai=True)
        started.append(s)
        return s.wait_ready()

    yield start
    for s in started:
        s.close()


class Stream(threading.Thread):
    """One streamed completion through the openai SDK: its text pieces, usage, and the error that ended it (None:
    whole) with when it came."""

    def __init__(self, s: OpenAIServe, model: str, max_tokens: int):
        super().__init__(daemon=True)
        self.s, self.model, self.max_tokens = s, model, max_tokens
        self.pieces, self.finish, self.usage, self.error, self.ended = [], None, None, None, None
        self.first = threading.Event()

    def run(self):
        try:
            for chunk in self.s.client.completions.create(
                model=self.model,
                prompt="Once upon a time",
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            ):
                if chunk.choices:
                    self.pieces.append(chunk.choices[0].text)
                    self.finish = chunk.choices[0].finish_reason or self.finish
                    self.first.set()
                if chunk.usage is not None:
                    self.usage = chunk.usage
        except Exception as e:  # noqa: BLE001 - what the SDK raised is the test's subject
            self.error = e
        finally:
            self.ended = time.monotonic()
            self.first.set()


def start_streams(s: OpenAIServe, models, max_tokens: int, n: int) -> list[Stream]:
    streams = [Stream(s, models[i % len(models)], max_tokens) for i in range(n)]
    for st in streams:
        st.start()
    for st in streams:
        assert st.first.wait(120) and st.error is None, st.error
    return streams


def assert_openai_errors_soon(streams: list[Stream], since: float, max_tokens: int) -> None:
    """Every stream ended early with the SDK's APIError from the server's OpenAI-shaped error event (a message, no
    traceback, no path), within ERROR_WITHIN_S of the fault."""
    for st in streams:
        st.join(ERROR_WITHIN_S + 5)
    report = [(type(st.error).__name__, str(st.error)[:200], st.ended and round(st.ended - since, 1)) for st in streams]
    for st in streams:
        assert not st.is_alive(), f"a stream still hangs {ERROR_WITHIN_S + 5:.0f}s after the fault: {report}"
        assert isinstance(st.error, openai.APIError) and not isinstance(st.error, openai.APIConnectionError), report
        body = st.error.body
        assert isinstance(body, dict) and body.get("message") and body.get("type") == "server_error", report
        assert "Traceback" not in body["message"] and "/tmp/" not in body["message"], report
        assert st.ended - since < ERROR_WITHIN_S, report
        assert st.usage is None or st.usage.completion_tokens < max_tokens, report
    last = max(st.ended for st in streams) - since
    print(f"{len(streams)} OpenAI streams ended with a 503 error event {last:.1f} s after the fault")


@pytest.mark.slow  # a server of its own (~30-60 s): `make slow`, which CI runs
def test_tritonserver_killed_ends_openai_streams_with_an_error_and_serve_exits_1(serve):
    s = serve()
    streams = start_streams(s, [SPECULATIVE, BASELINE], 400, 4)
    t0 = time.monotonic()
    os.kill(s.pid("tritonserver", "--model-repository"), signal.SIGKILL)
    assert_openai_errors_soon(streams, t0, 400)
    assert "Triton at" in str(streams[0].error), streams[0].error  # names what it could not reach
    assert s.health() != 200
    rc = s.proc.wait(15)
    assert rc == 1, s.stderr()
    assert "error: tritonserver exited with code -9" in s.stderr()
    assert s.wait_gone(10) == {} and refused(s.openai_port)


@pytest.mark.slow  # a server of its own (~30-60 s): `make slow`, which CI runs
def test_a_killed_stub_ends_openai_streams_with_an_error_and_serve_exits_3(serve):
    s = serve()
    streams = start_streams(s, [SPECULATIVE], 400, 4)
    stub = s.pid("triton_python_backend_stub", "/tensorrt_llm_bls/")
    t0 = time.monotonic()
    os.kill(stub, signal.SIGKILL)
    assert_openai_errors_soon(streams, t0, 400)
    rc = s.proc.wait(15)
    assert rc == 3, s.stderr()
    assert f"model tensorrt_llm_bls stopped (its python-backend process {stub} died)" in s.stderr()
    assert s.wait_gone(10) == {} and refused(s.openai_port)


@pytest.mark.slow  # a server of its own (~40 s): `make slow`, which CI runs
def test_sigterm_drains_openai_streams_then_exits_0(serve):
    """SIGTERM with 8 OpenAI streams of 64 tokens in flight (4 speculative, 4 baseline): the frontend's /health
    turns 503, a new request gets a 503 naming the shutdown (the SDK would retry it elsewhere), every stream finishes
    whole (64 tokens, finish_reason "length", then [DONE]), and serve exits 0."""
    s = serve()
    streams = start_streams(s, [SPECULATIVE, BASELINE], 64, 8)
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while s.health() == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.health() == 503, "the frontend's /health still 200 while draining"
    with pytest.raises(openai.APIStatusError) as late:
        s.client.completions.create(model=SPECULATIVE, prompt="late", max_tokens=4)
    assert late.value.status_code == 503 and "shutting down" in late.value.message, late.value
    for st in streams:
        st.join(120)
    got = [(st.error, st.finish, st.usage and st.usage.completion_tokens) for st in streams]
    assert got == [(None, "length", 64)] * 8, got
    assert s.proc.wait(60) == 0, s.stderr()
    assert "drained in" in s.stderr() and s.wait_gone(10) == {}


@pytest.mark.slow  # a server of its own (~30-60 s): `make slow`, which CI runs
def test_the_frontend_killed_alone_stops_serve_with_one_line(serve):
    s = serve()
    frontend = s.pid("trt_spec.serve.openai.frontend")
    os.kill(frontend, signal.SIGKILL)
    try:
        rc = s.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve still running 15 s after its OpenAI frontend died:\n{s.stderr()}")
    err = s.stderr()
    assert rc == 1, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "the OpenAI frontend exited with code -9" in lines[0], err
    assert s.wait_gone(10) == {} and refused(s.http)
