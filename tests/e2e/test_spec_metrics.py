"""The BLS's Prometheus metrics, scraped from a real tritonserver's metrics port, equal the sums of the responses'
own whole-request metrics (total_draft_tokens, total_accepted_draft_tokens, total_steps,
accepted_length_histogram, draft_lengths) — exactly, as deltas between a scrape before and one after."""

from __future__ import annotations

import queue
import re
import time
import urllib.request
from collections import Counter

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trt_spec.harness.client import ClientError, LLMClient
from trt_spec.in_triton.spec_metrics import LATENCY_BUCKETS, histogram, parse_metrics, scrape, scraped_acceptance, value
from trt_spec.records import names as n

from ..farm import DEPLOYMENTS

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
    "class Stack:\n    def push(self, x):",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "for i in range(10):\n   ",
]
# fixed: on a shared server the adaptive policy may have learned that speculation does not pay here, and this test
# is about the accounting of rounds that did speculate
GREEDY = {"exclude_input_in_output": True, "draft_len_policy": "fixed"}
COUNTERS = (
    n.METRIC_REQUESTS,
    n.METRIC_DRAFT_TOKENS,
    n.METRIC_ACCEPTED_TOKENS,
    n.METRIC_ROUNDS,
    n.METRIC_ROUNDS_NO_SPEC,
)
HISTOGRAMS = (n.METRIC_ACCEPTED_LENGTH, n.METRIC_DRAFT_LENGTH, n.METRIC_DRAFT_LATENCY, n.METRIC_VERIFY_LATENCY)


def metrics_url(server) -> str:
    return f"http://{server.http_url.rsplit(':', 1)[0]}:{server.metrics_port}/metrics"


def send(server) -> list[dict]:
    """A mix: both protocols, streaming and not, k = 0 (no speculation), 1, 2 and the default (max_draft_len);
    the responses' metrics outputs."""
    grpc, http = LLMClient(server.grpc_url, "grpc"), LLMClient(server.http_url, "http")
    sent = [
        (grpc, PROMPTS[0], 24, {}),
        (grpc, PROMPTS[1], 16, {"num_draft_tokens": 2}),
        (http, PROMPTS[2], 20, {"num_draft_tokens": 0}),
        (grpc, PROMPTS[3], 12, {"num_draft_tokens": 1, "stream": True}),
        (http, PROMPTS[0], 8, {"num_draft_tokens": 3}),
    ]
    return [c.generate(n.BLS, p, max_tokens, **GREEDY, **kw).metrics for c, p, max_tokens, kw in sent]


def as_list(v) -> list[int]:
    """A list metric; HTTP /generate returns a one-element list as a bare number (the client passes it on)."""
    return v if isinstance(v, list) else [v]


def cumulative(counts: list[int]) -> list[int]:
    return [sum(counts[: i + 1]) for i in range(len(counts))]


@pytest.mark.parametrize("fixture,mode", [("ngram_server", "ngram"), ("dtm_server", "draft_target")])
def test_prometheus_metrics_equal_the_responses_own(request, fixture, mode):
    server = request.getfixturevalue(fixture)
    max_draft_len = DEPLOYMENTS[fixture.removesuffix("_server")].k
    url = metrics_url(server)
    labels = {"model": n.BLS, "mode": mode}
    before = scrape(url)
    got = send(server)
    with pytest.raises(ClientError, match="num_draft_tokens 9"):  # refused: not a finished request, not counted
        LLMClient(server.grpc_url, "grpc").generate(n.BLS, PROMPTS[0], 8, num_draft_tokens=9)
    after = scrape(url)

    def delta(name: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    def delta_hist(name: str) -> list[float]:
        b, a = histogram(before, name, **labels), histogram(after, name, **labels)
        return [a[le] - b.get(le, 0.0) for le in a]

    # the responses' own figures
    drafted = sum(m["total_draft_tokens"] for m in got)
    accepted = sum(m["total_accepted_draft_tokens"] for m in got)
    rounds = sum(m["total_steps"] for m in got)
    accepted_hist = [0] * (max_draft_len + 1)
    for m in got:
        for i, c in enumerate(as_list(m["accepted_length_histogram"])):
            accepted_hist[i] += c
    ks = Counter(k for m in got for k in as_list(m["draft_lengths"]))
    k_hist = [ks[i] for i in range(max_draft_len + 1)]
    # the responses' histogram counts the rounds that speculated (k > 0); the mix has rounds without
    assert sum(accepted_hist) == rounds - ks[0] and sum(k_hist) == rounds and drafted > 0 and ks[0] > 0

    assert delta(n.METRIC_REQUESTS) == len(got)
    assert delta(n.METRIC_DRAFT_TOKENS) == drafted
    assert delta(n.METRIC_ACCEPTED_TOKENS) == accepted
    assert delta(n.METRIC_ROUNDS) == rounds
    assert delta(n.METRIC_ROUNDS_NO_SPEC) == ks[0]
    # integer histograms: buckets le = 0..max_draft_len, then +Inf
    assert delta_hist(n.METRIC_ACCEPTED_LENGTH) == [*cumulative(accepted_hist), rounds - ks[0]]
    assert delta(f"{n.METRIC_ACCEPTED_LENGTH}_count") == rounds - ks[0]
    assert delta(f"{n.METRIC_ACCEPTED_LENGTH}_sum") == accepted
    assert delta_hist(n.METRIC_DRAFT_LENGTH) == [*cumulative(k_hist), rounds]
    assert delta(f"{n.METRIC_DRAFT_LENGTH}_count") == rounds
    assert delta(f"{n.METRIC_DRAFT_LENGTH}_sum") == sum(k * c for k, c in ks.items())
    # latencies: one observation per round, in the published buckets
    for name in (n.METRIC_DRAFT_LATENCY, n.METRIC_VERIFY_LATENCY):
        assert list(histogram(after, name, **labels)) == [*LATENCY_BUCKETS, float("inf")]
        buckets = delta_hist(name)
        assert buckets == sorted(buckets) and buckets[-1] == rounds == delta(f"{name}_count")
    assert 0 < delta(f"{n.METRIC_VERIFY_LATENCY}_sum") < 120
    summary = scraped_acceptance(after)
    assert summary["drafted"] == value(after, n.METRIC_DRAFT_TOKENS, model=n.BLS)
    # the same counts under vLLM's names and labels (Triton serves the colon names as they are)
    vllm = {"model_name": n.BLS, "engine": "0"}

    def vdelta(name: str, **extra) -> float:
        return value(after, name, **vllm, **extra) - value(before, name, **vllm, **extra)

    assert vdelta(n.VLLM_NUM_DRAFT_TOKENS) == drafted and vdelta(n.VLLM_NUM_ACCEPTED_TOKENS) == accepted
    assert vdelta(n.VLLM_NUM_DRAFTS) == rounds - ks[0]  # a draft = a speculative round
    per_pos = [vdelta(n.VLLM_NUM_ACCEPTED_PER_POS, position=str(i)) for i in range(max_draft_len)]
    assert per_pos == [sum(accepted_hist[i + 1 :]) for i in range(max_draft_len)] and sum(per_pos) == accepted


def test_metric_names_and_types_as_published(ngram_server):
    """The names are exactly the documented ones (the exporter adds or strips no `_total`), with their types."""
    with urllib.request.urlopen(metrics_url(ngram_server), timeout=10) as r:
        text = r.read().decode()
    types = dict(re.findall(r"^# TYPE (trt_spec_\S+) (\S+)$", text, re.M))
    assert types == {
        **{c: "counter" for c in COUNTERS},
        **{h: "histogram" for h in HISTOGRAMS},
        n.METRIC_IN_FLIGHT: "gauge",
        # the suffix proposer's cross-request cache (on by default: scope tenant)
        n.METRIC_CACHE_ROUNDS: "counter",
        n.METRIC_CACHE_ACCEPTED: "counter",
        n.METRIC_CACHE_TOKENS: "gauge",
    }
    # the engines' request metrics, as the tensorrtllm backend names and labels them
    assert re.search(r"^# TYPE nv_trt_llm_request_metrics gauge$", text, re.M)
    active = [s for s in parse_metrics(text) if s.name == "nv_trt_llm_request_metrics"]
    assert {(s.labels["model"], s.labels["request_type"]) for s in active} >= {
        ("tensorrt_llm", t) for t in ("active", "max", "scheduled", "context", "waiting")
    }
    vllm = dict(re.findall(r"^# TYPE (vllm:\S+) (\S+)$", text, re.M))
    assert vllm == {
        name: "counter"
        for name in (
            n.VLLM_NUM_DRAFTS,
            n.VLLM_NUM_DRAFT_TOKENS,
            n.VLLM_NUM_ACCEPTED_TOKENS,
            n.VLLM_NUM_ACCEPTED_PER_POS,
        )
    }
    samples = parse_metrics(text)
    assert {s.labels["mode"] for s in samples if s.name.startswith("trt_spec_")} == {"ngram"}
    assert {s.labels["model"] for s in samples if s.name.startswith("trt_spec_")} == {n.BLS}


def test_cancelled_requests_are_not_counted(ngram_server):
    """A stream cancelled after its first response ends without a final result: not a finished request, so it
    publishes nothing — neither when the BLS notices the cancellation (within a round) nor later (we wait longer
    than the whole request takes uncancelled)."""
    url, labels = metrics_url(ngram_server), {"model": n.BLS, "mode": "ngram"}
    before = scrape(url)
    t0 = time.perf_counter()
    whole = LLMClient(ngram_server.grpc_url, "grpc").generate(n.BLS, PROMPTS[1], 400, end_id=-1, stream=True, **GREEDY)
    seconds = time.perf_counter() - t0
    assert len(whole.output_ids) == 400
    c = grpcclient.InferenceServerClient(ngram_server.grpc_url)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    inputs = []
    for name, v, dtype, kind in (
        ("text_input", [[PROMPTS[1].encode()]], object, "BYTES"),
        ("max_tokens", [[400]], np.int32, "INT32"),
        ("stream", [[True]], bool, "BOOL"),
        ("end_id", [[-1]], np.int32, "INT32"),
    ):
        t = grpcclient.InferInput(name, [1, 1], kind)
        t.set_data_from_numpy(np.asarray(v, dtype=dtype))
        inputs.append(t)
    c.async_stream_infer(n.BLS, inputs)
    got.get(timeout=60)
    c.stop_stream(cancel_requests=True)
    c.close()
    time.sleep(1.5 * seconds + 0.5)
    after = scrape(url)
    assert value(after, n.METRIC_REQUESTS, **labels) - value(before, n.METRIC_REQUESTS, **labels) == 1
    assert (
        value(after, n.METRIC_ROUNDS, **labels) - value(before, n.METRIC_ROUNDS, **labels)
        == whole.metrics["total_steps"]
    )
