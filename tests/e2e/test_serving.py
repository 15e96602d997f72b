"""The reference engine served by a real tritonserver: ensemble vs speculative BLS over HTTP and gRPC,
streaming, concurrency, bad requests, clean shutdown."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trt_spec.harness.client import ClientError, LLMClient

from ..farm import DEPLOYMENTS

PROMPTS = [
    "def add(a, b):\n    return",
    "class Stack:\n    def push(self, x):",
    "The quick brown fox",
    "import numpy as np\nx =",
    "for i in range(10):\n   ",
    "Hello, world! What is",
]
GREEDY = {"exclude_input_in_output": True}


def both(server, proto):
    return LLMClient(server.grpc_url if proto == "grpc" else server.http_url, proto)


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_speculative_equals_baseline_token_for_token(dtm_server, proto):
    c = both(dtm_server, proto)
    for p in PROMPTS[:4]:
        base = c.generate("ensemble", p, 24, **GREEDY)
        spec = c.generate("tensorrt_llm_bls", p, 24, num_draft_tokens=3, **GREEDY)
        assert len(base.output_ids) == 24 or base.output_ids[-1] == 2
        assert spec.output_ids == base.output_ids, p
        assert spec.text == base.text
        m = spec.metrics
        assert m["total_draft_tokens"] > 0
        assert m["acceptance_rate"] == pytest.approx(
            m["total_accepted_draft_tokens"] / m["total_draft_tokens"], rel=1e-6
        )  # sent as float32
        # the histogram counts rounds that verified drafts; draft_lengths has every round, 0 where none was verified
        assert len(m["draft_lengths"]) == m["total_steps"]
        assert sum(m["accepted_length_histogram"]) == m["total_steps"] - m["draft_lengths"].count(0)
        assert m["total_accepted_draft_tokens"] == sum(i * n for i, n in enumerate(m["accepted_length_histogram"]))


@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_ngram_bls_equals_baseline(ngram_server, policy):
    """The draft-free suffix proposer under both draft-length policies: the target's own output."""
    c = both(ngram_server, "grpc")
    for p in PROMPTS:
        base = c.generate("ensemble", p, 32, **GREEDY)
        spec = c.generate("tensorrt_llm_bls", p, 32, draft_len_policy=policy, **GREEDY)
        assert spec.output_ids == base.output_ids, p
        ks = spec.metrics["draft_lengths"]
        assert len(ks) == spec.metrics["total_steps"] and all(0 <= k <= 4 for k in ks)


def test_bls_streaming_grpc_and_http_sse(dtm_server):
    for proto in ("grpc", "http"):
        c = both(dtm_server, proto)
        whole = c.generate("tensorrt_llm_bls", PROMPTS[0], 20, num_draft_tokens=2, **GREEDY)
        streamed = c.generate("tensorrt_llm_bls", PROMPTS[0], 20, num_draft_tokens=2, stream=True, **GREEDY)
        assert streamed.output_ids == whole.output_ids
        assert streamed.text == whole.text
        assert streamed.chunks > 1 and streamed.ttft_s < streamed.latency_s
        assert streamed.metrics["total_steps"] == streamed.chunks


def test_baseline_streams_too(dtm_server):
    c = both(dtm_server, "grpc")
    whole = c.generate("ensemble", PROMPTS[1], 16, **GREEDY)
    streamed = c.generate("ensemble", PROMPTS[1], 16, stream=True, **GREEDY)
    assert streamed.output_ids == whole.output_ids and streamed.chunks == len(whole.output_ids)


def test_sixteen_concurrent_requests(dtm_server):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(16)]
    c = both(dtm_server, "grpc")
    expected = [c.generate("ensemble", p, 12, **GREEDY).output_ids for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        got = list(
            pool.map(
                lambda p: (
                    both(dtm_server, "grpc")
                    .generate("tensorrt_llm_bls", p, 12, num_draft_tokens=3, **GREEDY)
                    .output_ids
                ),
                prompts,
            )
        )
    assert got == expected


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"prompt": ""}, "text_input is empty"),
        ({"num_draft_tokens": 9}, f"num_draft_tokens 9 is outside 0..max_draft_len ({DEPLOYMENTS['dtm'].k})"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": 5000}, "exceeds max_seq_len 512"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"draft_len_policy": "greedy"}, "draft_len_policy 'greedy' is not one of adaptive, fixed"),
    ],
)
def test_bad_requests_get_errors_and_server_stays_up(dtm_server, kwargs, message):
    c = both(dtm_server, "http")
    args = {"prompt": PROMPTS[0], "max_tokens": 8, **kwargs}
    with pytest.raises(ClientError, match=message.replace("(", r"\(").replace(")", r"\)")):
        c.generate("tensorrt_llm_bls", args.pop("prompt"), args.pop("max_tokens"), **args)
    ok = c.generate("tensorrt_llm_bls", PROMPTS[0], 8, **GREEDY)
    assert ok.output_ids == c.generate("ensemble", PROMPTS[0], 8, **GREEDY).output_ids  # still serves, correctly


def test_wrong_dtype_and_batch_rejected(dtm_server):
    import numpy as np
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(dtm_server.grpc_url)
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    bad = grpcclient.InferInput("max_tokens", [1, 1], "FP32")  # must be INT32
    bad.set_data_from_numpy(np.array([[8.0]], dtype=np.float32))
    errors = []
    c.start_stream(callback=lambda result, error: errors.append(error))
    c.async_stream_infer("tensorrt_llm_bls", [text, bad])
    wide = grpcclient.InferInput("text_input", [1, 2], "BYTES")  # two prompts in one row: Triton's shape check
    wide.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    mt = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    mt.set_data_from_numpy(np.array([[4]], dtype=np.int32))
    c.async_stream_infer("tensorrt_llm_bls", [wide, mt])
    batch = grpcclient.InferInput("text_input", [2, 1], "BYTES")  # a batch of two: the BLS refuses it
    batch.set_data_from_numpy(np.array([[b"a"], [b"b"]], dtype=object))
    mt2 = grpcclient.InferInput("max_tokens", [2, 1], "INT32")
    mt2.set_data_from_numpy(np.array([[4], [4]], dtype=np.int32))
    c.async_stream_infer("tensorrt_llm_bls", [batch, mt2])
    import time

    deadline = time.time() + 30
    while len(errors) < 3 and time.time() < deadline:
        time.sleep(0.1)
    c.stop_stream()
    msgs = " | ".join(str(e) for e in errors)
    assert "data-type is 'FP32'" in msgs
    assert "unexpected shape" in msgs
    assert "exactly one prompt per request (got 2)" in msgs
    after = both(dtm_server, "grpc")
    assert (
        after.generate("tensorrt_llm_bls", PROMPTS[2], 4, **GREEDY).output_ids
        == after.generate("ensemble", PROMPTS[2], 4, **GREEDY).output_ids
    )  # the refused requests broke nothing


def test_unknown_model_and_server_down(dtm_server):
    for proto in ("grpc", "http"):
        with pytest.raises(ClientError, match="model 'nope' is not loaded"):
            both(dtm_server, proto).check_ready(["nope"])
    with pytest.raises(ClientError, match="no Triton server ready at 127.0.0.1:1"):
        LLMClient("127.0.0.1:1", "http").check_ready(["ensemble"])


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_serve_stop_leaves_nothing_behind(farm, tmp_path):
    from trt_spec.serve.server import TritonServer, free_port

    repo = farm.copy_repo("ngram", tmp_path / "repo")
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    server.start().wait_ready(180)
    pgid = server.proc.pid
    assert list(Path("/dev/shm").glob(f"{server.spec.shm_prefix}*"))
    server.stop()
    assert server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not list(Path("/dev/shm").glob(f"{server.spec.shm_prefix}*"))
