"""Reliability on a real tritonserver: fuzzed requests, a concurrency soak, cancellation.

Every malformed request gets one clear answer (an error line with no stack trace, no path, no doubled model
prefix) or a valid response; none hangs, none kills a model, and greedy outputs are the same after the fuzzing
as before. The long soak (`make soak`) runs the same checks with more streams and rounds."""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trt_spec.harness.client import LLMClient
from trt_spec.in_triton.spec_metrics import scrape, value
from trt_spec.records import backend_contract as bc

from ..requests import PROMPTS, TIMEOUT_S, _tensor, b, f32, i32, ids, raw, text

GREEDY: dict = {}
# A leaked trace or path: "Traceback", 'File "/...', an absolute path, a python "At:" frame list.
LEAK = re.compile(r"Traceback|File \"|(^|[\s'\"(])/(tmp|work|usr|root|home|opt)/|\bAt:\s")
DOUBLED = re.compile(r"\b([\w.]+): \1:")


OK_TEXT = [text("def add(a, b):"), i32("max_tokens", 6)]
# (model, tensors, requested outputs or None) — what clients get wrong, and a few odd-but-valid requests.
BLS = "tensorrt_llm_bls"
FRONT = [
    [text("")],
    [i32("max_tokens", 4)],
    [("text_input", [[b"a", b"b"]], object), i32("max_tokens", 4)],
    [text("hi")],
    [text("hi"), i32("max_tokens", 0)],
    [text("hi"), i32("max_tokens", -5)],
    [text("hi"), i32("max_tokens", 2**31 - 1)],
    [text("word " * 600), i32("max_tokens", 4)],
    [text("hi"), i32("max_tokens", 600)],
    [*OK_TEXT, f32("temperature", -1.0)],
    [*OK_TEXT, f32("temperature", float("nan"))],
    [*OK_TEXT, f32("temperature", float("inf"))],
    [*OK_TEXT, f32("temperature", 1e30)],
    [*OK_TEXT, i32("top_k", -1)],
    [*OK_TEXT, i32("top_k", 10**9)],
    [*OK_TEXT, f32("top_p", -0.5)],
    [*OK_TEXT, f32("top_p", 1.5)],
    [*OK_TEXT, f32("top_p", float("nan"))],
    [*OK_TEXT, ("seed", [[2**64 - 1]], np.uint64), f32("temperature", 0.7), i32("top_k", 5)],
    [*OK_TEXT, i32("end_id", -5)],
    [*OK_TEXT, i32("end_id", 10**6)],
    [*OK_TEXT, i32("pad_id", -1)],
    [*OK_TEXT, ("stop_words", [[b""]], object)],
    [*OK_TEXT, ("stop_words", [[b"x" * 5000]], object)],
    [*OK_TEXT, ("bad_words", [[b"the"]], object)],
    [*OK_TEXT, i32("beam_width", 2)],
    [*OK_TEXT, i32("num_return_sequences", 3)],
    [*OK_TEXT, ("max_tokens", [[4.0]], np.float32)],
    [("text_input", [[b"\xff\xfe\x00broken utf-8"]], object), i32("max_tokens", 4)],
    [text("emoji \U0001f680 and NUL \x00 inside"), i32("max_tokens", 4)],
    [*OK_TEXT, ("not_an_input", [[1]], np.int32)],
    [("text_input", [[[b"x"]]], object), i32("max_tokens", 4)],
    [*OK_TEXT, b("exclude_input_in_output", True), b("return_perf_metrics", True)],
]
BLS_ONLY = [
    [*OK_TEXT, i32("num_draft_tokens", -1)],
    [*OK_TEXT, i32("num_draft_tokens", 5)],
    [*OK_TEXT, i32("num_draft_tokens", 1000)],
    [*OK_TEXT, b("use_draft_logits", True), f32("temperature", 0.8)],
    [*OK_TEXT, b("stream", True), i32("num_draft_tokens", 0)],
]
ENGINE = [
    [i32("request_output_len", 4)],
    [ids("input_ids", []), i32("input_lengths", 0), i32("request_output_len", 4)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 0)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", -3)],
    [ids("input_ids", [5, 10**6]), i32("input_lengths", 2), i32("request_output_len", 4)],
    [ids("input_ids", [5, -4]), i32("input_lengths", 2), i32("request_output_len", 4)],
    [ids("input_ids", [5, 6]), i32("input_lengths", -1), i32("request_output_len", 4)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 900), i32("request_output_len", 4)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), ids("draft_input_ids", [1] * 9)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), ids("draft_input_ids", [10**6])],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        ("stop_words_list", [[[5, 6, 7]]], np.int32),
    ],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        ("stop_words_list", [[[5, 6], [9, -1]]], np.int32),
    ],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        ("stop_words_list", [[[5, 6, 7], [2, 1, -1]]], np.int32),
    ],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        ("stop_words_list", [[[5, 6, 7], [1, -1, 3]]], np.int32),
    ],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        f32("temperature", float("inf")),
        i32("runtime_top_k", 4),
    ],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), i32("runtime_top_k", -1)],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        i32("runtime_top_k", 10**9),
        f32("temperature", 1.0),
    ],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), i32("beam_width", 2)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), i32("num_return_sequences", 2)],
    [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4), i32("end_id", 10**6)],
    [
        ids("input_ids", [5, 6]),
        i32("input_lengths", 2),
        i32("request_output_len", 4),
        ids("draft_input_ids", [7, 8]),
        ("draft_logits", [[[0.0] * 3]], np.float32),
    ],
    [
        ("input_ids", [[5, 6], [7, 8]], np.int32),
        ("input_lengths", [[2], [2]], np.int32),
        ("request_output_len", [[4], [4]], np.int32),
    ],
]


def fuzz_cases():
    cases = [("ensemble", t) for t in FRONT] + [(BLS, t) for t in FRONT + BLS_ONLY]
    cases += [(m, t) for m in ("tensorrt_llm", "tensorrt_llm_draft") for t in ENGINE]
    one_output = [ids("input_ids", [5, 6]), i32("input_lengths", 2), i32("request_output_len", 4)]
    cases += [("tensorrt_llm", one_output, ["output_ids"])]  # only one of the two mandatory outputs
    return cases


def greedy_outputs(server):
    c = LLMClient(server.grpc_url, "grpc")
    return [c.generate(m, p, 10, **GREEDY).output_ids for m in ("ensemble", BLS) for p in PROMPTS]


def check_answer(kind, answer, case):
    assert kind != "hang", f"{case}: {answer}"
    if kind == "error":
        assert "\n" not in answer.strip(), f"{case}: a multi-line error: {answer!r}"
        assert not LEAK.search(answer), f"{case}: a trace or path reached the client: {answer!r}"
        assert not DOUBLED.search(answer), f"{case}: a doubled prefix: {answer!r}"


def test_fuzzed_requests_get_one_clear_answer_and_change_nothing(dtm_server):
    before = greedy_outputs(dtm_server)
    cases = fuzz_cases()
    results = []
    for case in cases:
        model, tensors = case[0], case[1]
        outputs = (
            case[2]
            if len(case) > 2
            else (["output_ids", "sequence_length"] if "llm" in model and model != BLS else None)
        )
        kind, answer = raw(dtm_server.grpc_url, model, tensors, outputs)
        check_answer(kind, answer if kind == "error" else "", (model, [t[0] for t in tensors]))
        results.append(kind)
    assert results.count("error") >= 50  # most of these are mistakes and must be refused
    assert greedy_outputs(dtm_server) == before  # nothing leaked into later requests


def soak(server, streams: int, rounds: int) -> dict:
    """`streams` concurrent greedy requests per round (BLS and ensemble, streaming and not, mixed k and lengths);
    every output must equal its solo run. Returns RSS growth of the server's processes."""
    rng = np.random.default_rng(0)
    jobs = [
        (
            PROMPTS[i % len(PROMPTS)] + f" {i}",
            int(rng.integers(4, 24)),
            (BLS, "ensemble")[i % 3 == 0],
            bool(i % 2),
            int(rng.integers(0, 5)),
        )
        for i in range(streams)
    ]

    def one(job):
        p, n, m, stream, k = job
        extra = {"num_draft_tokens": k} if m == BLS else {}
        g = LLMClient(server.grpc_url, "grpc").generate(m, p, n, stream=stream, **GREEDY, **extra)
        return g.text, g.output_ids

    solo = [one(job) for job in jobs]  # each request alone first
    rss = []
    for _ in range(rounds):
        with ThreadPoolExecutor(streams) as pool:
            got = list(pool.map(one, jobs))
        for job, out, alone in zip(jobs, got, solo):
            assert out == alone, f"mixed or lost output for {job}"
        rss.append(server_rss(server))
    return {"rss_first": rss[0], "rss_last": rss[-1]}


def server_rss(server) -> int:
    """Resident memory (bytes) of tritonserver and all its descendants."""
    import psutil

    root = psutil.Process(server.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def test_sixty_four_concurrent_streams_lose_nothing(dtm_server):
    r = soak(dtm_server, streams=64, rounds=2)
    assert r["rss_last"] < r["rss_first"] * 1.10 + 64 * 2**20  # bounded: no growth per round beyond noise


@pytest.mark.soak
def test_soak(dtm_server):
    r = soak(
        dtm_server, streams=int(os.environ.get("SOAK_STREAMS", "96")), rounds=int(os.environ.get("SOAK_ROUNDS", "8"))
    )
    print(f"soak rss: {r['rss_first'] / 2**20:.0f} MiB -> {r['rss_last'] / 2**20:.0f} MiB")
    assert r["rss_last"] < r["rss_first"] * 1.10 + 64 * 2**20


def _cancel_after_first_response(url, model, tensors):
    """Start a stream, wait for its first response, then cancel it (what a client that goes away does)."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer(model, [_tensor(*t) for t in tensors], enable_empty_final_response=True)
    q.get(timeout=TIMEOUT_S)
    c.stop_stream(cancel_requests=True)
    c.close()


# The BLS only: an ensemble's engine step in flight is never told of a cancellation (Triton's ensemble scheduler
# cancels only the steps it schedules afterwards; docs/reliability.md) — on the tiny model its 16 calls simply run out
# within this test's bound, so an ensemble case here would pass without proving anything.
@pytest.mark.parametrize("model", [BLS])
def test_cancelled_streams_stop_using_the_engine(dtm_server, model):
    """16 long streams cancelled after their first token must not keep the engine busy: a short request sent
    right after them is served about as fast as on an idle server (without cancellation it waits for all
    16 x 400 tokens)."""
    c = LLMClient(dtm_server.grpc_url, "grpc")
    c.generate(model, PROMPTS[0], 8, **GREEDY)  # warm
    t0 = time.perf_counter()
    c.generate(model, PROMPTS[1], 8, **GREEDY)
    idle = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert len(c.generate(model, PROMPTS[2], 400, end_id=-1, exclude_input_in_output=True, **GREEDY).output_ids) == 400
    one_long = time.perf_counter() - t0
    long = [text(PROMPTS[3]), i32("max_tokens", 400), b("stream", True), i32("end_id", -1)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: _cancel_after_first_response(dtm_server.grpc_url, model, long), range(16)))
    t0 = time.perf_counter()
    c.generate(model, PROMPTS[1], 8, **GREEDY)
    after = time.perf_counter() - t0
    print(f"{model}: idle {idle:.2f}s, one 400-token request {one_long:.2f}s, after 16 cancellations {after:.2f}s")
    # Uncancelled, the 16 streams queue ~16 x one_long of work ahead of it (the engine runs one sequence at a
    # time); cancelled, only the tokens produced before the cancellation arrived remain. Generous for a busy CI
    # machine, and still fails without cancellation. (The ratio after/idle is measured in docs/reliability.md.)
    assert after < max(3 * idle, 0.5 * 16 * one_long), (idle, one_long, after)


# --- clients that go away -----------------------------------------------------------------------------------------


def engine_active(server) -> float:
    """Requests holding a slot in the deployment's engines, as the backend publishes it (nv_trt_llm_request_metrics,
    request_type="active", refreshed every stats_check_period_ms)."""
    samples = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return value(samples, bc.REQUEST_METRICS, request_type="active")


def _reset_after_first_chunk(url, model, max_tokens):
    """POST /generate_stream over a raw socket, read until the first server-sent event, then reset the connection
    (SO_LINGER 0: an RST, what a client killed by its own timeout leaves behind)."""
    host, port = url.split(":")
    body = json.dumps({"text_input": PROMPTS[3], "max_tokens": max_tokens, "end_id": -1, "stream": True}).encode()
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sk:
        sk.sendall(
            f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data = b""
        while b"data:" not in data:
            chunk = sk.recv(4096)
            assert chunk, data
            data += chunk
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("fixture", ["dtm_server", "ngram_server"])
def test_reset_http_streams_leave_the_engine_idle(fixture, request):
    """32 HTTP /generate_stream clients of the speculative model reset their connection after the first chunk:
    Triton cancels each request when its next chunk fails to go out, the BLS stops at its next round, and the
    engines hold no request 2 s after the last reset (each would otherwise run 400 tokens)."""
    server = request.getfixturevalue(fixture)
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda _: _reset_after_first_chunk(server.http_url, BLS, 400), range(32)))
    t0 = time.perf_counter()
    while (busy := engine_active(server)) > 0 and time.perf_counter() - t0 < 10:
        time.sleep(0.05)
    idle_after = time.perf_counter() - t0
    print(f"{fixture}: engines idle {idle_after:.2f}s after 32 reset streams")
    assert busy == 0 and idle_after < 2.0, (busy, idle_after)
    c = LLMClient(server.grpc_url, "grpc")
    assert c.generate(BLS, PROMPTS[0], 8, **GREEDY).output_ids  # and it still serves


# --- oversized input ----------------------------------------------------------------------------------------------


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("model", ["ensemble", BLS])
def test_a_10_mb_prompt_is_refused_at_once_with_flat_memory(dtm_server, model):
    """10 MB of text_input, then 10 MB of stop words (gRPC), and 3.5 MB over /generate's JSON: one error line naming
    the limit within a second, before any tokenizing — the python models' memory stays flat (tokenizing 10 MB took
    12-15 s and 1.7 GB). (Over 4 MiB of JSON, Triton 2.51's own HTTP server crashes before any model sees the
    request: docs/reliability.md.)"""

    def models_rss() -> int:
        return sum(_rss(pid) for pid in dtm_server.stubs())

    ten_mb = b"word " * (2 * 2**20)
    before = models_rss()
    for field, tensors in (
        ("text_input", [text(ten_mb), i32("max_tokens", 4)]),
        ("stop_words", [text("hi"), i32("max_tokens", 4), ("stop_words", [[ten_mb]], object)]),
    ):
        t0 = time.perf_counter()
        kind, message = raw(dtm_server.grpc_url, model, tensors)
        elapsed = time.perf_counter() - t0
        print(f"{model} {field}: refused in {elapsed:.2f}s: {message}")
        assert kind == "error" and f"{field} is 10485760 bytes" in message and "max_input_len" in message, message
        assert "\n" not in message and not LEAK.search(message) and elapsed < 1.0
    body = {"text_input": "word " * (7 * 2**20 // 10), "max_tokens": 4}  # 3.5 MiB of JSON
    req = urllib.request.Request(
        f"http://{dtm_server.http_url}/v2/models/{model}/generate", data=json.dumps(body).encode(), method="POST"
    )
    t0 = time.perf_counter()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400 and "text_input is" in json.loads(e.value.read())["error"]
    assert time.perf_counter() - t0 < 1.0
    grown = models_rss() - before
    assert grown < 64 * 2**20, f"the python models grew by {grown / 2**20:.0f} MiB"


def test_served_model_configs_are_the_admin_keys_only(dtm_server):
    """The configs name this machine's engine and tokenizer directories (absolute, so that every launch finds them):
    GET /v2/models/NAME/config and gRPC ModelConfig are refused without the admin key and answer with it."""
    from tritonclient.utils import InferenceServerException

    from trt_spec.serve.admin_key import ADMIN_HEADER, GRPC_ADMIN_HEADER, admin_key_path

    key = admin_key_path(dtm_server.http_port).read_text().strip()
    g = grpcclient.InferenceServerClient(dtm_server.grpc_url)
    for model in ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", BLS, "ensemble"):
        url = f"http://{dtm_server.http_url}/v2/models/{model}/config"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=10)
        assert e.value.code == 403 and "restricted" in e.value.read().decode()
        with pytest.raises(InferenceServerException, match="restricted"):
            g.get_model_config(model)
        with urllib.request.urlopen(urllib.request.Request(url, headers={ADMIN_HEADER: key}), timeout=10) as r:
            params = {k: v["string_value"] for k, v in json.loads(r.read()).get("parameters", {}).items()}
        by_grpc = g.get_model_config(model, headers={GRPC_ADMIN_HEADER: key}, as_json=True)["config"]
        assert by_grpc["name"] == model
        for name in ("gpt_model_path", "tokenizer_dir"):
            assert name not in params or os.path.isabs(params[name]), (model, params)
    assert LLMClient(dtm_server.grpc_url, "grpc").generate("ensemble", PROMPTS[0], 4).output_ids


def test_a_json_value_of_the_wrong_type_is_tritons_own_500(dtm_server):
    """docs/reliability.md says so: Triton's JSON reader answers a string max_tokens with HTTP 500 before any model
    sees it."""
    req = urllib.request.Request(
        f"http://{dtm_server.http_url}/v2/models/{BLS}/generate",
        method="POST",
        data=json.dumps({"text_input": "hi", "max_tokens": "8"}).encode(),
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 500
    assert "attempt to access JSON non-signed-integer as signed-integer" in json.loads(e.value.read())["error"]
