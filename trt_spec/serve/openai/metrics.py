"""The OpenAI frontend's Prometheus metrics in vLLM's names and labels (so vLLM dashboards read trt-spec unchanged),
and per-request acceptance in vLLM's response shape. Each exporter has its own registry, so two apps in one process
do not collide.
"""

from __future__ import annotations

import math
from typing import Optional

from ...records import names as n

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


# the frontend's own admission metrics: server-wide, no model label
ADMITTED_METRIC = "trt_spec_openai_requests_admitted"
WAITING_METRIC = "trt_spec_openai_requests_waiting"
REFUSED_METRIC = "trt_spec_openai_requests_refused_total"  # {reason: queue_full | unauthorized | too_large}
ABANDONED_METRIC = "trt_spec_openai_streams_abandoned_total"  # the client stopped reading (send timeout)


class FrontendMetricsExporter:
    """The frontend's Prometheus metrics, labelled per model, and their exposition."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]

        def counter(name, doc):  # prometheus_client adds _total
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
        self.refused_c = Counter(
            REFUSED_METRIC.removesuffix("_total"),
            "Requests refused by the frontend",
            ["reason"],
            registry=self.registry,
        )
        self.abandoned_c = Counter(
            ABANDONED_METRIC.removesuffix("_total"), "Responses abandoned: client not reading", registry=self.registry
        )

    def watch_admission(self, admission) -> None:
        """Gauges read from the frontend's Admission at each scrape."""
        from prometheus_client import Gauge

        Gauge(ADMITTED_METRIC, "Requests admitted to Triton", registry=self.registry).set_function(
            lambda: admission.running
        )
        Gauge(WAITING_METRIC, "Requests waiting for admission", registry=self.registry).set_function(
            lambda: admission.waiting
        )

    def refused(self, reason: str) -> None:
        self.refused_c.labels(reason).inc()

    def abandoned(self) -> None:
        self.abandoned_c.inc()

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


# -- Per-request acceptance in the response body, in vLLM's shape ----------------------------------------------
# Keys and semantics (upstream-facts: vllm-per-request-acceptance); AIPerf claims the payload only with
# acceptance_histogram and num_spec_steps (upstream-facts: aiperf-spec-decode-reader). Loop modes' histogram counts
# only rounds that drafted, as vLLM skips steps without drafts; in-engine modes build it per engine step where they
# can, else it is empty and only the counts and rate are sent.
SPEC_DECODE_KEY = "speculative_decoding"  # under the body's top-level "metrics"
MEAN_ACCEPTANCE_LENGTH = "mean_acceptance_length"
DRAFT_ACCEPTANCE_RATE = "draft_acceptance_rate"
ACCEPTANCE_HISTOGRAM = "acceptance_histogram"
NUM_SPEC_STEPS = "num_spec_steps"
NUM_ACCEPTED_DRAFT_TOKENS = "num_accepted_draft_tokens"
NUM_DRAFT_TOKENS = "num_draft_tokens"
NUM_SPEC_TOKENS = "num_spec_tokens"


def speculative_decoding(outputs: dict[str, list[int] | float]) -> Optional[dict]:
    """vLLM's `metrics.speculative_decoding` from the BLS's metric outputs; None without totals."""
    if "total_accepted_draft_tokens" not in outputs or "total_draft_tokens" not in outputs:
        return None
    accepted, drafted = int(outputs["total_accepted_draft_tokens"]), int(outputs["total_draft_tokens"])
    out: dict = {
        DRAFT_ACCEPTANCE_RATE: accepted / drafted if drafted else 0.0,
        NUM_ACCEPTED_DRAFT_TOKENS: accepted,
        NUM_DRAFT_TOKENS: drafted,
    }
    hist = [int(x) for x in outputs.get(n.ACCEPTED_LENGTH_HISTOGRAM) or []]
    if not hist:  # no histogram: no step count either
        return out
    steps = sum(hist)
    # zero steps: 1.0 (upstream-facts: vllm-acceptance-len-no-drafts)
    return {
        MEAN_ACCEPTANCE_LENGTH: 1.0 + accepted / steps if steps else 1.0,
        **out,
        ACCEPTANCE_HISTOGRAM: hist,
        NUM_SPEC_STEPS: steps,
        NUM_SPEC_TOKENS: len(hist) - 1,
    }


# runtime llmapi: the model's perf outputs (strings) carry counts and a rate but no histogram or step count, so only
# those are sent, never invented steps. A zero draft count despite a speculative_config gets a note beside
# speculative_decoding (upstream-facts: trtllm-pytorch-spec-perf-zero).
LLMAPI_SPEC_OUTPUTS = ("total_accepted_draft_tokens", "total_draft_tokens", "acceptance_rate")
LLMAPI_NOTE_KEY = "trt_spec_acceptance_note"  # beside SPEC_DECODE_KEY
LLMAPI_ZERO_NOTE = (
    "not measured: the LLM-API model reported 0 drafted tokens although its model.yaml has a speculative_config; "
    "TensorRT-LLM 1.2.1's PyTorch flow leaves its per-request speculative perf outputs 0 (NVIDIA/TensorRT-LLM#17082)"
)


def _perf_number(v) -> Optional[float]:
    try:
        return float(v.decode() if isinstance(v, bytes) else v)
    except (TypeError, ValueError, UnicodeDecodeError):
        return None


def llmapi_speculative_decoding(outputs: dict) -> tuple[Optional[dict], Optional[str]]:
    """(speculative_decoding from the LLM-API model's perf outputs, a note or None); (None, None) without counts."""
    accepted, drafted, rate = (_perf_number(outputs.get(name)) for name in LLMAPI_SPEC_OUTPUTS)
    if accepted is None or drafted is None or accepted < 0 or drafted < 0:
        return None, None
    if rate is None or not math.isfinite(rate):
        rate = accepted / drafted if drafted else 0.0
    out = {
        DRAFT_ACCEPTANCE_RATE: rate,
        NUM_ACCEPTED_DRAFT_TOKENS: int(accepted),
        NUM_DRAFT_TOKENS: int(drafted),
    }
    return out, LLMAPI_ZERO_NOTE if drafted == 0 else None
