"""EAGLE in the engine on a real tritonserver: the target engine drafts with its trained EAGLE-3 head and verifies in
its own forward. The ensemble and the BLS (engine mode) answer exactly what the baseline engine answers, streamed and
unary, over both protocols; the BLS reports the engine's own draft counts, and its steps as the accepted-length
histogram, which the OpenAI frontend returns in vLLM's shape; the engine streams whole steps."""

from __future__ import annotations

import json

import numpy as np

from trt_spec.harness.client import GREEDY, LLMClient
from trt_spec.records import backend_contract as bc
from trt_spec.records.names import ACCEPTED_LENGTH_HISTOGRAM, BASELINE_ENGINE, SPECULATIVE, TARGET

from ..farm import cli_in_process, tokenizer_dir


def test_check_passes_and_bench_reports_in_engine_acceptance(eagle_server):
    for proto, url in (("grpc", eagle_server.grpc_url), ("http", eagle_server.http_url)):
        r = cli_in_process(
            "check",
            "--url",
            url,
            "--protocol",
            proto,
            "--prompts",
            "code",
            "--max-tokens",
            "24",
            "--limit",
            "3",
            "--tokenizer",
            tokenizer_dir(eagle_server.repo),
            "--format",
            "json",
        )
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["passed"] and rep["match_rate"] == 1.0
    from trt_spec.harness.bench import paired_ab
    from trt_spec.harness.prompts import Prompt

    prompts = [Prompt("def add(a, b):\n    return", 24), Prompt("The quick brown fox", 24)]
    for proto, url in (("grpc", eagle_server.grpc_url), ("http", eagle_server.http_url)):
        rep = paired_ab(LLMClient(url, proto), prompts, k=4, warmup=0)
        acc = rep["acceptance"]
        assert acc["drafted"] > 0 and 0 < acc["accepted"] <= acc["drafted"]
        assert rep["speedup"] > 0


def test_the_engine_streams_whole_steps_with_its_draft_counts(eagle_server):
    """One streamed request straight to the eagle engine: each response carries a step's tokens (some more than one),
    the perf outputs count the drafts; the tokens equal the baseline engine's."""
    import tritonclient.grpc as grpcclient

    prompt = [5, 17, 99, 3, 42, 8, 8, 61, 12, 40]

    def run(model, stream):
        c = grpcclient.InferenceServerClient(eagle_server.grpc_url.split("://")[-1])
        ins = []
        for name, arr in (
            (bc.INPUT_IDS, np.asarray([prompt], np.int32)),
            (bc.INPUT_LENGTHS, np.asarray([[len(prompt)]], np.int32)),
            (bc.REQUEST_OUTPUT_LEN, np.asarray([[32]], np.int32)),
            (bc.STREAMING, np.asarray([[stream]], bool)),
            (bc.RETURN_PERF_METRICS, np.asarray([[True]], bool)),
        ):
            t = grpcclient.InferInput(name, list(arr.shape), "BOOL" if arr.dtype == bool else "INT32")
            t.set_data_from_numpy(arr)
            ins.append(t)
        outs = [grpcclient.InferRequestedOutput(n) for n in (*bc.MANDATORY_OUTPUTS, *bc.SPEC_PERF_OUTPUTS)]
        got = []
        c.start_stream(callback=lambda result, error: got.append(error or result))
        c.async_stream_infer(model, ins, outputs=outs)
        c.stop_stream()  # waits for the final response
        c.close()
        errors = [g for g in got if isinstance(g, Exception)]
        assert not errors, errors
        return [g.as_numpy(bc.OUTPUT_IDS).reshape(-1).tolist() for g in got], got

    steps, got = run(TARGET, True)
    base, _ = run(BASELINE_ENGINE, True)
    flat = [t for s in steps for t in s]
    assert flat == [t for s in base for t in s] and len(flat) == 32
    assert max(len(s) for s in steps) > 1
    drafted = int(got[-1].as_numpy("total_draft_tokens").reshape(-1)[0])
    assert drafted > 0


def _adds_up(hist: list, accepted: int, drafted: int, k: int) -> None:
    """A histogram of the engine's verify steps: one bucket per accepted count 0..k, its j-weighted sum the engine's
    accepted total, each step drafting at most k (the reference engine's chains can stop early)."""
    assert len(hist) == k + 1 and sum(hist) > 0
    assert sum(j * h for j, h in enumerate(hist)) == accepted
    assert sum(hist) <= drafted <= k * sum(hist)


def test_the_bls_reports_the_engines_steps_streamed_or_not(eagle_server):
    """The BLS streams its engine call in a decoupled deployment whatever the client asked: both a unary and a streamed
    request get the histogram of the engine's steps, adding up with the engine's own totals, with stop words too (a
    request they end may end mid-step: the engine counted that step whole)."""
    c = LLMClient(eagle_server.grpc_url, "grpc")
    try:
        for stream in (False, True):
            for extra in ({}, {"stop_words": ["return"]}):
                g = c.generate(SPECULATIVE, "def add(a, b):\n    return", 24, stream=stream, **GREEDY, **extra)
                m = g.metrics
                _adds_up(
                    list(m[ACCEPTED_LENGTH_HISTOGRAM]), m["total_accepted_draft_tokens"], m["total_draft_tokens"], 4
                )
    finally:
        c.close()


def test_the_openai_frontend_returns_vllms_acceptance_for_an_eagle_deployment(eagle_server):
    """The frontend (in this process, over the eagle deployment's gRPC port) answers vLLM's metrics.speculative_decoding
    with the histogram AIPerf 0.13 needs (aiperf/spec_decode/vllm_adapter.py claims a payload only with
    acceptance_histogram and num_spec_steps; aiperf/common/models/spec_decode_models.py drops one whose sums disagree),
    on the unary body and the streamed usage chunk."""
    from fastapi.testclient import TestClient

    from trt_spec.serve.launch import ServedRepository
    from trt_spec.serve.openai.frontend import create_app
    from trt_spec.serve.openai.requests import FrontendSettings

    settings = FrontendSettings.from_repository(
        ServedRepository.load(eagle_server.repo), eagle_server.grpc_url.split("://")[-1]
    )
    body = {"model": SPECULATIVE, "prompt": "def add(a, b):\n    return", "max_tokens": 24, "temperature": 0}
    with TestClient(create_app(settings)) as http:
        unary = http.post("/v1/completions", json=body).json()
        lines = http.post(
            "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ).text.splitlines()
    usage = [json.loads(x[6:]) for x in lines if x.startswith("data: {")][-1]
    assert usage["choices"] == []
    for resp in (unary, usage):
        spec = resp["metrics"]["speculative_decoding"]
        hist, k = spec["acceptance_histogram"], spec["num_spec_tokens"]
        assert k == 4 and len(hist) == k + 1  # AIPerf's three checks
        assert sum(hist) == spec["num_spec_steps"] > 0
        assert sum(j * h for j, h in enumerate(hist)) == spec["num_accepted_draft_tokens"]
        assert spec["mean_acceptance_length"] == 1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
        _adds_up(hist, spec["num_accepted_draft_tokens"], spec["num_draft_tokens"], k)
