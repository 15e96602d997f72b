"""The OpenAI frontend's Prometheus metrics: request latency and token counts as the client sees them, in vLLM's
names and labels (records/names.py VLLM_*: model_name, engine), so dashboards and autoscalers written for vLLM read
a trt-spec deployment unchanged. The speculation counters are not here: the BLS publishes them on Triton's metrics
port (in_triton/spec_metrics.py). Each exporter has its own registry, not prometheus_client's global one, so two
apps in one process (tests) do not collide.
"""

from __future__ import annotations

from typing import Optional

from ..records import names as n

FRONTEND_METRICS = (
    n.VLLM_TTFT,
    n.VLLM_ITL,
    n.VLLM_E2E,
    n.VLLM_PROMPT_TOKENS,
    n.VLLM_GENERATION_TOKENS,
    n.VLLM_REQUEST_SUCCESS,
    n.VLLM_RUNNING,
)
LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class FrontendMetricsExporter:
    """The frontend's Prometheus metrics (FRONTEND_METRICS), labelled per model, and their exposition."""

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
