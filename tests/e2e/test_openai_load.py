"""Load and slow readers on `trt-spec serve --openai-port`, over the real tritonserver (the n-gram deployment of the
tiny target, chat template included): 256 concurrent streaming chat completions each equal to its solo run; 64
clients that open a stream and never read while 8 well-behaved clients keep their time to first token within 2x of
an idle server's; 1,000 connections opened and dropped without sending; and the frontend's memory and open files
back to their baseline after each. `make slow` (CI runs it); the figures print with -s (README's reliability
section).

Loopback gives every server socket a 4 MiB send buffer and the tiny model's streams are ~2 KB, so a client that
merely stops reading never makes the frontend wait: the non-readers here announce a small MSS (the kernel then sizes
the server's send buffer to tens of KB, as for a remote client) and pipeline /openapi.json requests behind their
stream until the frontend's sends are really stuck (checked in /proc/net/tcp), as a slow reader's are in production.
Linux only, as the rest of the suite (tritonserver)."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
import urllib.request
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from trt_spec.records.names import SPECULATIVE  # noqa: E402

from ..farm import env_without_openai_key, serve_openai, stop_serve  # noqa: E402

STREAMS, DISTINCT = 256, 32  # 32 distinct prompts, 8 streams each
NON_READERS, READERS = 64, 8
RSS_SLACK = 20 << 20  # the frontend's RSS may exceed its baseline by this after a load (allocator slack), no more
FD_SLACK = 4  # open fds: the baseline, give or take this many
PIPELINED = 16  # /openapi.json requests behind each non-reader's stream: ~180 KB it never takes
ASYNCIO_HIGH_WATER = 64 << 10  # asyncio's transport buffer above which uvicorn's send waits for the socket to drain


@pytest.fixture(scope="module")
def loaded(chat_repo, tmp_path_factory):
    """serve --openai-port (no key: loopback), sized to admit all 256 at once: (base URL, frontend process)."""
    tmp = tmp_path_factory.mktemp("load")
    proc, _, ports, _ = serve_openai(
        chat_repo, tmp, "--openai-max-concurrent", "256", "--openai-max-queued", "256", env=env_without_openai_key()
    )
    (frontend,) = [
        p for p in psutil.Process(proc.pid).children() if "trt_spec.serve.openai.frontend" in " ".join(p.cmdline())
    ]
    yield f"http://127.0.0.1:{ports['openai']}", frontend
    stop_serve(proc)


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
        if (rss <= base_fp[0] + RSS_SLACK and abs(fds - base_fp[1]) <= FD_SLACK) or time.monotonic() > deadline:
            break
    print(f"{what}: frontend RSS {base_fp[0] / 2**20:.1f} -> {rss / 2**20:.1f} MiB, fds {base_fp[1]} -> {fds}")
    assert rss <= base_fp[0] + RSS_SLACK, (what, base_fp[0], rss)
    assert abs(fds - base_fp[1]) <= FD_SLACK, (what, base_fp[1], fds)


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.mark.slow  # ~20 s: `make slow`, which CI runs
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
    """A client that sends a streaming chat, then PIPELINED requests for /openapi.json, and never reads: a tiny
    receive buffer and a small MSS (so the server's send buffer is sized for it, not loopback's 4 MiB), so the
    frontend's sends to it back up and wait (SendTimeout abandons them after 60 s; the test is over long before)."""
    host, port = base.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    more = f"GET /openapi.json HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() * PIPELINED
    s.sendall(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload + more)
    return s


def unsent(server_port: int) -> dict[int, int]:
    """{client port: bytes the server's kernel holds unsent (the client's window closed)} for the server's
    established IPv4 connections (/proc/net/tcp: local address, remote address, state 01, tx_queue:rx_queue)."""
    out = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == server_port and f[3] == "01":
            out[int(f[2].split(":")[1], 16)] = int(f[4].split(":")[0], 16)
    return out


def wait_stuck(base: str, sockets: list[socket.socket]) -> dict[int, int]:
    """Once the non-readers' generation is over (no slot admitted) and what the server's kernel holds for each no
    longer changes: that backlog per client port."""
    port, mine = int(base.rsplit(":", 1)[1]), {s.getsockname()[1] for s in sockets}
    deadline, before = time.monotonic() + 45, None
    while True:
        now = {p: q for p, q in unsent(port).items() if p in mine}
        if now == before and len(now) == len(mine) and metric(base, "trt_spec_openai_requests_admitted") == 0:
            return now
        assert time.monotonic() < deadline, ("the non-readers did not settle in 45 s", now)
        before = now
        time.sleep(0.5)


def ttfts(base: str, rounds: int = 5) -> list[float]:
    """READERS streams at once, `rounds` times, after one round not counted (the first after a change pays one-off
    costs): every time to first token."""
    out = []
    for r in range(rounds + 1):
        got = asyncio.run(many(base, [chat(f"Reader {i} round {r}: count to ten", 4) for i in range(READERS)]))
        assert all(g["done"] and not g["errors"] and g["ttft"] is not None for g in got), got
        out += [g["ttft"] for g in got] if r else []
    return out


@pytest.mark.slow  # ~30 s: `make slow`, which CI runs
def test_64_clients_that_never_read_do_not_slow_the_others(loaded):
    """The non-readers' answers are generated at the model's pace and their slots freed when generation ends
    (openai/guard.py Admission); the frontend's sends to them then wait on their sockets, which must cost the others
    nothing: the event loop serves them as if the server were idle. Then they are closed, and everything is back."""
    base, frontend = loaded
    with urllib.request.urlopen(base + "/openapi.json", timeout=10) as r:
        owed = PIPELINED * len(r.read())  # bytes each non-reader is owed, at least
    idle = statistics.median(ttfts(base))
    baseline = footprint(frontend)
    sockets = [_non_reader(base, chat(f"Never read {i}: write a long story", 96)) for i in range(NON_READERS)]
    try:
        held = wait_stuck(base, sockets)
        rcvbuf = max(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in sockets)
        # the kernel holds some of what each is owed and the client's buffer some; more than asyncio's buffer takes
        # before uvicorn waits is left: the frontend's send to each is waiting on its socket
        assert all(0 < q and owed - q - rcvbuf > ASYNCIO_HIGH_WATER for q in held.values()), (owed, held)
        loaded_ttft = statistics.median(ttfts(base))
        fds_held = frontend.num_fds()
        abandoned = metric(base, "trt_spec_openai_streams_abandoned_total")
    finally:
        for s in sockets:
            s.close()
    print(
        f"TTFT median of {READERS} readers x 5 rounds: idle {idle * 1000:.0f} ms, with {NON_READERS} non-readers "
        f"stuck ({min(held.values())}-{max(held.values())} B unsent in the kernel each, {owed} B owed) "
        f"{loaded_ttft * 1000:.0f} ms ({loaded_ttft / idle:.2f}x); frontend fds {baseline[1]} -> {fds_held} while held"
    )
    assert fds_held >= baseline[1] + NON_READERS and abandoned == 0  # still connected and waiting while measured
    assert loaded_ttft <= 2 * idle, (idle, loaded_ttft)
    assert_back_to(baseline, frontend, f"after {NON_READERS} non-readers closed")
    for gauge in ("trt_spec_openai_requests_admitted", "trt_spec_openai_requests_waiting"):
        assert metric(base, gauge) == 0, gauge


def solo_walls(base: str, n: int = 3) -> tuple[str, float]:
    """The same short stream n times, one at a time: (its text, all n equal; the median wall time)."""
    got, walls = [], []
    for _ in range(n):
        t0 = time.monotonic()
        got.append(asyncio.run(many(base, [chat("After the storm", 8)]))[0])
        walls.append(time.monotonic() - t0)
    assert all((g["status"], g["done"], g["errors"], g["text"]) == (200, True, [], got[0]["text"]) for g in got), got
    return got[0]["text"], statistics.median(walls)


@pytest.mark.slow  # ~15 s: `make slow`, which CI runs
def test_1000_connections_dropped_without_a_request_leave_nothing_behind(loaded):
    base, frontend = loaded
    host, port = base.removeprefix("http://").split(":")
    reference, before = solo_walls(base)
    baseline = footprint(frontend)
    for _ in range(10):  # 100 at a time: open all, see the frontend accept them, then drop all
        batch = [socket.create_connection((host, int(port)), timeout=10) for _ in range(100)]
        deadline = time.monotonic() + 10
        while frontend.num_fds() < baseline[1] + len(batch):
            assert time.monotonic() < deadline, ("the frontend did not accept 100 connections", frontend.num_fds())
            time.sleep(0.05)
        for s in batch:
            s.close()
    text, after = solo_walls(base)
    print(f"1000 dropped connections: a request took {before * 1000:.0f} ms before, {after * 1000:.0f} ms after")
    assert text == reference
    assert after <= 2 * before + 0.5, (before, after)  # answered as quickly as before (a stall would be seconds)
    assert_back_to(baseline, frontend, "after 1000 dropped connections")
