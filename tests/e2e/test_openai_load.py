"""Load and slow readers on `trt-spec serve --openai-port`, over the real tritonserver (the n-gram deployment of the
tiny target, chat template included): 256 concurrent streaming chat completions each equal to its solo run; 64
clients that open a stream and never read while 8 well-behaved clients keep their time to first token within 2x of
an idle server's; 1,000 connections opened and dropped without sending; and the frontend's memory and open files
back to their baseline after each. `make slow` (CI runs it); the figures print with -s (README's reliability
section)."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
import urllib.request

import pytest

httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from trt_spec.records.names import SPECULATIVE  # noqa: E402

from .test_openai_keys import chat_repo, no_key_env, serve, stop  # noqa: E402, F401 - chat_repo: the fixture

STREAMS, DISTINCT = 256, 32  # 32 distinct prompts, 8 streams each
NON_READERS, READERS = 64, 8
RSS_SLACK = 24 << 20  # the frontend's RSS may exceed its baseline by this after a load (allocator slack), no more
FD_SLACK = 4


@pytest.fixture(scope="module")
def loaded(chat_repo, tmp_path_factory):  # noqa: F811 - the imported fixture
    """serve --openai-port (no key: loopback), sized to admit all 256 at once: (base URL, frontend process)."""
    tmp = tmp_path_factory.mktemp("load")
    proc, _, ports, _ = serve(
        chat_repo, tmp, "--openai-max-concurrent", "256", "--openai-max-queued", "256", env=no_key_env()
    )
    (frontend,) = [
        p for p in psutil.Process(proc.pid).children() if "trt_spec.serve.openai_frontend" in " ".join(p.cmdline())
    ]
    yield f"http://127.0.0.1:{ports['openai']}", frontend
    stop(proc)


def chat(prompt: str, max_tokens: int) -> dict:
    return {
        "model": SPECULATIVE,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


async def stream(client, base: str, body: dict) -> dict:
    """One streamed chat read to its end: its text, finish reason, whether [DONE] came, errors, time to first token."""
    t0, out = time.monotonic(), {"text": "", "finish": None, "done": False, "errors": [], "ttft": None}
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        out["status"] = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                continue
            event = json.loads(data)
            if "error" in event:
                out["errors"].append(event["error"])
                continue
            for choice in event["choices"]:
                piece = choice["delta"].get("content")
                if piece and out["ttft"] is None:
                    out["ttft"] = time.monotonic() - t0
                out["text"] += piece or ""
                out["finish"] = choice["finish_reason"] or out["finish"]
    return out


async def many(base: str, bodies: list[dict]) -> list[dict]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        return await asyncio.gather(*(stream(client, base, b) for b in bodies))


def footprint(frontend, settle_s: float = 2.0) -> tuple[int, int]:
    """(RSS bytes, open fds) of the frontend once it has had `settle_s` to close what its clients closed."""
    time.sleep(settle_s)
    return frontend.memory_info().rss, frontend.num_fds()


def assert_back_to(base_fp: tuple[int, int], frontend, what: str) -> None:
    deadline = time.monotonic() + 15  # keep-alive connections close after 5 s (defaults.OPENAI_KEEP_ALIVE_S)
    while True:
        rss, fds = footprint(frontend, 1.0)
        if (rss <= base_fp[0] + RSS_SLACK and fds <= base_fp[1] + FD_SLACK) or time.monotonic() > deadline:
            break
    print(f"{what}: frontend RSS {base_fp[0] >> 20} -> {rss >> 20} MiB, fds {base_fp[1]} -> {fds}")
    assert rss <= base_fp[0] + RSS_SLACK, (what, base_fp[0], rss)
    assert fds <= base_fp[1] + FD_SLACK, (what, base_fp[1], fds)


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.mark.slow  # ~1-2 min: `make slow`, which CI runs
def test_256_concurrent_streams_each_equal_their_solo_run(loaded):
    base, frontend = loaded
    prompts = [f"Item {i}: tell me about the number {i * 7}" for i in range(DISTINCT)]
    solo = {p: asyncio.run(many(base, [chat(p, 8)]))[0] for p in prompts}  # one at a time, the reference
    assert all(s["done"] and not s["errors"] and s["text"] for s in solo.values()), solo
    bodies = [chat(prompts[i % DISTINCT], 8) for i in range(STREAMS)]
    asyncio.run(many(base, bodies))  # a first round: the allocator's high-water mark for 256 streams is the baseline
    baseline = footprint(frontend)
    t0 = time.monotonic()
    got = asyncio.run(many(base, bodies))
    wall = time.monotonic() - t0
    wrong = [
        (i, g)
        for i, g in enumerate(got)
        if (g["status"], g["text"], g["done"], g["errors"], g["finish"] is not None)
        != (200, solo[prompts[i % DISTINCT]]["text"], True, [], True)
    ]
    print(f"{STREAMS} concurrent streaming chats in {wall:.1f}s: {STREAMS - len(wrong)} equal to their solo run")
    assert not wrong, wrong[:3]
    assert_back_to(baseline, frontend, f"after {STREAMS} streams")


def _non_reader(base: str, body: dict) -> socket.socket:
    """A client that sends a streaming request and never reads: a tiny receive buffer, so the server's sends back up."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    s.sendall(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return s


def ttfts(base: str, rounds: int = 3) -> list[float]:
    out = []
    for r in range(rounds):
        got = asyncio.run(many(base, [chat(f"Reader {i} round {r}: count to ten", 4) for i in range(READERS)]))
        assert all(g["done"] and not g["errors"] and g["ttft"] is not None for g in got), got
        out += [g["ttft"] for g in got]
    return out


@pytest.mark.slow  # ~1 min: `make slow`, which CI runs
def test_64_clients_that_never_read_do_not_slow_the_others(loaded):
    """The non-readers' answers are generated into the frontend's memory at the model's pace and their slots freed
    (openai_guard.Admission), so once their tokens are made they cost the others nothing; then they are closed."""
    base, frontend = loaded
    ttfts(base, 1)  # warm-up
    baseline = footprint(frontend)
    idle = statistics.median(ttfts(base))
    sockets = [_non_reader(base, chat(f"Never read {i}: write a long story", 96)) for i in range(NON_READERS)]
    try:
        deadline = time.monotonic() + 180
        while metric(base, "trt_spec_openai_requests_admitted") > 0:  # their generation is over
            assert time.monotonic() < deadline, "the non-readers still hold slots after 180 s"
            time.sleep(0.5)
        loaded_ttft = statistics.median(ttfts(base))
        held = footprint(frontend, 0)
    finally:
        for s in sockets:
            s.close()
    print(
        f"TTFT median of {READERS} readers x 3 rounds: idle {idle * 1000:.0f} ms, with {NON_READERS} non-readers "
        f"connected {loaded_ttft * 1000:.0f} ms ({loaded_ttft / idle:.2f}x); frontend fds while held {held[1]}"
    )
    assert held[1] >= baseline[1] + NON_READERS  # they were really connected while the others were measured
    assert loaded_ttft <= 2 * idle, (idle, loaded_ttft)
    assert_back_to(baseline, frontend, f"after {NON_READERS} non-readers closed")


@pytest.mark.slow  # ~30 s: `make slow`, which CI runs
def test_1000_connections_dropped_without_a_request_leave_nothing_behind(loaded):
    base, frontend = loaded
    host, port = base.removeprefix("http://").split(":")
    reference = asyncio.run(many(base, [chat("After the storm", 8)]))[0]
    baseline = footprint(frontend)
    for _ in range(10):  # 100 at a time: open all, then drop all
        batch = [socket.create_connection((host, int(port)), timeout=10) for _ in range(100)]
        for s in batch:
            s.close()
    after = asyncio.run(many(base, [chat("After the storm", 8)]))[0]
    assert (after["text"], after["done"], after["errors"]) == (reference["text"], True, [])
    assert_back_to(baseline, frontend, "after 1000 dropped connections")
