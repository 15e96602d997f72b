"""In-flight batching on a real tritonserver: the engine stand-in serves concurrent requests in shared forwards,
refuses requests beyond `max_queue_size` with the executor's error, and a cancelled request frees its slot while
the others go on. (Token identity of 64 concurrent mixed requests vs their solo runs: test_reliability.py.)"""

from __future__ import annotations

import queue
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

from trt_spec.harness.client import LLMClient
from trt_spec.records import backend_contract as bc

from ..farm import LIMITS, MAX_QUEUE
from ..requests import PROMPTS, _tensor, b, i32, raw

GREEDY: dict = {}
BATCH_LINE = re.compile(r"tensorrt_llm: batching: (\d+) iterations, sequences per forward max (\d+)")
MAX_BATCH = LIMITS["max_batch_size"]
LONG = 440  # tokens per long request: keeps a slot busy for a while on the tiny model


def engine_request(prompt_ids, n, stream=True):
    return [
        ("input_ids", [prompt_ids], np.int32),
        i32("input_lengths", len(prompt_ids)),
        i32("request_output_len", n),
        i32("end_id", -1),
        b("streaming", stream),
    ]


class Stream:
    """One engine request on its own gRPC stream, read on a thread: first-token and end times, tokens, error."""

    def __init__(self, url, tensors):
        self.tokens: list[int] = []
        self.error = None
        self.first = self.end = None
        self._q: queue.Queue = queue.Queue()
        self._c = grpcclient.InferenceServerClient(url)
        self._c.start_stream(callback=lambda result, error: self._q.put((result, error)))
        self._c.async_stream_infer(
            "tensorrt_llm",
            [_tensor(*t) for t in tensors],
            outputs=[grpcclient.InferRequestedOutput(n) for n in bc.MANDATORY_OUTPUTS],
            enable_empty_final_response=True,
        )
        self.started = time.perf_counter()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        while True:
            try:
                result, error = self._q.get(timeout=120)
            except queue.Empty:
                self.error = "hang"
                break
            if error is not None:
                self.error = str(getattr(error, "message", lambda: error)())
                break
            resp = result.get_response()
            if resp.outputs:
                new = [int(t) for t in result.as_numpy("output_ids").reshape(-1)]
                if new and self.first is None:
                    self.first = time.perf_counter()
                self.tokens += new
            if resp.parameters["triton_final_response"].bool_param:
                break
        self.end = time.perf_counter()

    def wait(self, timeout=150.0):
        self._t.join(timeout)
        return self

    def cancel(self):
        self._c.stop_stream(cancel_requests=True)

    def close(self):
        self._c.stop_stream(cancel_requests=self.end is None)
        self._c.close()


def batch_lines(server) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for m in BATCH_LINE.finditer(server.log_path.read_text(errors="replace"))]


def test_concurrent_requests_share_forwards(dtm_server):
    """16 concurrent requests (BLS and ensemble): the engine reports forwards holding more than one sequence."""
    before = len(batch_lines(dtm_server))
    jobs = [(PROMPTS[i % len(PROMPTS)] + f" {i}", 16 + i, ("tensorrt_llm_bls", "ensemble")[i % 2]) for i in range(16)]

    def one(job):
        p, n, m = job
        return LLMClient(dtm_server.grpc_url, "grpc").generate(m, p, n, **GREEDY).output_ids

    solo = [one(j) for j in jobs]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, jobs))
    assert got == solo
    deadline = time.time() + 10  # the summary is logged when the engine drains
    while time.time() < deadline and len(batch_lines(dtm_server)) <= before:
        time.sleep(0.2)
    lines = batch_lines(dtm_server)[before:]
    assert lines, "the engine logged no batching summary"
    assert max(seqs for _, seqs in lines) > 1, lines


def test_full_queue_gets_the_executors_error(faulty_server):
    """MAX_BATCH long requests take every slot, MAX_QUEUE more wait; the next ones are refused at once with the
    text TensorRT-LLM's executor throws (backend_contract.QUEUE_FULL); the others all finish."""
    prompt = [5, 6, 7, 8]
    streams = []
    try:
        for _ in range(MAX_BATCH + MAX_QUEUE):
            streams.append(Stream(faulty_server.grpc_url, engine_request(prompt, LONG)))
            time.sleep(0.02)  # one at a time through Triton's own queue (it applies the same bound)
        refused = [
            raw(faulty_server.grpc_url, "tensorrt_llm", engine_request(prompt, 8), outputs=list(bc.MANDATORY_OUTPUTS))
            for _ in range(2)
        ]
        for s in streams:
            s.wait()
    finally:
        for s in streams:
            s.close()
    assert refused == [("error", bc.QUEUE_FULL.format(max=MAX_QUEUE))] * 2, refused
    assert all(s.error is None and len(s.tokens) == LONG for s in streams), [(s.error, len(s.tokens)) for s in streams]
    # and the queue accepts again once it drained
    kind, out = raw(
        faulty_server.grpc_url, "tensorrt_llm", engine_request(prompt, 8), outputs=list(bc.MANDATORY_OUTPUTS)
    )
    assert kind == "ok", out


def test_cancelled_request_frees_its_slot_while_others_continue(faulty_server):
    """Every slot busy and one request queued: cancelling one running request lets the queued one start while
    the other running ones are still generating, and they finish with their full, unchanged output."""
    prompts = [[5 + i, 9, 11, 13] for i in range(MAX_BATCH + 1)]
    solo, solo_s = [], []
    for p in prompts:
        s = Stream(faulty_server.grpc_url, engine_request(p, LONG)).wait()
        s.close()
        solo.append(s.tokens)
        solo_s.append(s.end - s.first)
    # Speed-independent: the queued request is checked well within the time one long request takes alone (four
    # batched together each take longer), so no running request can have finished by then on any machine.
    pause = min(0.2, min(solo_s) / 4)
    running = []
    try:
        # One at a time, each running before the next is sent: Triton's own queue (max_queue_size, requests not yet
        # handed to execute) refuses a burst beyond MAX_QUEUE even with slots free ("Exceeds maximum queue size").
        for p in prompts[:MAX_BATCH]:
            running.append(Stream(faulty_server.grpc_url, engine_request(p, LONG)))
            deadline = time.time() + 60
            while time.time() < deadline and running[-1].first is None and running[-1].end is None:
                time.sleep(0.002)
            assert running[-1].error is None and running[-1].first is not None, running[-1].error
        queued = Stream(faulty_server.grpc_url, engine_request(prompts[-1], LONG))
        time.sleep(pause)
        assert queued.first is None, (
            "the queued request started before a slot was free",
            queued.first,
            [(s.first, s.end, s.error, len(s.tokens)) for s in running],
            time.perf_counter(),
        )
        cancelled_at = time.perf_counter()
        running[0].cancel()
        others = running[1:]
        for s in [*others, queued]:
            s.wait()
    finally:
        for s in [*running, queued]:
            s.close()
    assert queued.error is None and queued.tokens == solo[-1]
    for s, alone in zip(others, solo[1:]):
        assert s.error is None and s.tokens == alone
    # the queued request got its slot from the cancellation, not from a finished request
    assert cancelled_at < queued.first < min(s.end for s in others), (
        cancelled_at,
        queued.first,
        [s.end for s in others],
    )
