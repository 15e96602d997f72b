"""The OpenAI frontend's Prometheus metrics: request latency and token counts as the client sees them, in vLLM's
names and labels (records/names.py VLLM_*: model_name, engine), so dashboards and autoscalers written for vLLM read
a trt-spec deployment unchanged. The speculation counters are not here: the BLS publishes them on Triton's metrics
port (in_triton/spec_metrics.py). Each exporter has its own registry, not prometheus_client's global one, so two
apps in one process (tests) do not collide.

Also here: the per-request acceptance the speculative model's responses carry, in vLLM's shape (speculative_decoding).
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


# The frontend's own admission metrics (openai/guard.py), beside vLLM's: no model label (they are the server's)
ADMITTED_METRIC = "trt_spec_openai_requests_admitted"  # requests holding a slot (their Triton call running)
WAITING_METRIC = "trt_spec_openai_requests_waiting"  # requests queued for a slot
REFUSED_METRIC = "trt_spec_openai_requests_refused_total"  # {reason: queue_full | unauthorized | too_large}
ABANDONED_METRIC = "trt_spec_openai_streams_abandoned_total"  # responses whose client stopped reading (send timeout)


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
# vLLM (PR #48915, "Per-request acceptance stats in OpenAI API responses"; its doc vllm-project/vllm
# docs/features/speculative_decoding/acceptance_metrics.md at 02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08):
#   the top-level `metrics` object of a completion / chat.completion body holds `speculative_decoding`:
#     mean_acceptance_length     1 + num_accepted_draft_tokens / num_spec_steps (bonus token included)
#     draft_acceptance_rate      num_accepted_draft_tokens / num_draft_tokens
#     acceptance_histogram       dense list of num_spec_tokens + 1 ints: [j] = verify steps that accepted exactly j
#                                drafts (bonus excluded); steps without scheduled drafts are not counted
#     num_spec_steps             verify steps (= sum of the histogram; vllm:spec_decode_num_drafts_total summed)
#     num_accepted_draft_tokens  (vllm:spec_decode_num_accepted_tokens_total summed)
#     num_draft_tokens           (vllm:spec_decode_num_draft_tokens_total summed)
#     num_spec_tokens            k, the most drafts per step
#   present when speculation is on and n == 1, all-zero histogram if nothing was drafted; `null` otherwise (and the
#   response unchanged when the feature is off). Streaming: `metrics` rides the final usage chunk (`choices: []`),
#   sent only with stream_options.include_usage.
# AIPerf 0.13.0 reads it there (aiperf/endpoints/base_endpoint.py extract_spec_decode_stats: json["metrics"]
# ["speculative_decoding"], the body or the trailing usage chunk) and claims it only when acceptance_histogram and
# num_spec_steps are both present (aiperf/spec_decode/vllm_adapter.py _VLLM_SIGNATURE_KEYS); it checks
# len(histogram) == num_spec_tokens + 1, sum(histogram) == num_spec_steps and sum(j * h[j]) == accepted
# (aiperf/common/models/spec_decode_models.py), and drops a payload that fails.
#
# trt-spec's source: the BLS's whole-request outputs on its final response (records/names.py METRIC_OUTPUTS;
# model_repo/tensorrt_llm_bls). Loop modes (draft_target, ngram): accepted_length_histogram is the request's
# rounds that drafted, by accepted count 0..k (k = the request's num_draft_tokens), which is vLLM's histogram and
# num_spec_steps; rounds the policy ran without a draft are not in it, as vLLM leaves out steps without drafts.
# In-engine modes (Medusa/EAGLE/lookahead): the BLS streams its engine call in a decoupled repository and builds the
# histogram from the engine's running totals per step (in_triton/speculative_loop.py engine_step_histogram; k = the
# engine's max_draft_len); where it could not (a non-decoupled repository, or steps it could not tell apart) the
# histogram is empty and only the counts and the rate are sent: AIPerf needs the histogram and shows none then.
SPEC_DECODE_KEY = "speculative_decoding"  # under the body's top-level "metrics"
MEAN_ACCEPTANCE_LENGTH = "mean_acceptance_length"
DRAFT_ACCEPTANCE_RATE = "draft_acceptance_rate"
ACCEPTANCE_HISTOGRAM = "acceptance_histogram"
NUM_SPEC_STEPS = "num_spec_steps"
NUM_ACCEPTED_DRAFT_TOKENS = "num_accepted_draft_tokens"
NUM_DRAFT_TOKENS = "num_draft_tokens"
NUM_SPEC_TOKENS = "num_spec_tokens"


def speculative_decoding(outputs: dict[str, list[int] | float]) -> Optional[dict]:
    """vLLM's `metrics.speculative_decoding` for one request from the BLS's metric outputs (scalars, and lists for
    records.names.LIST_METRICS); None when the response carried no totals (a request cut short by the client)."""
    if "total_accepted_draft_tokens" not in outputs or "total_draft_tokens" not in outputs:
        return None
    accepted, drafted = int(outputs["total_accepted_draft_tokens"]), int(outputs["total_draft_tokens"])
    out: dict = {
        DRAFT_ACCEPTANCE_RATE: accepted / drafted if drafted else 0.0,
        NUM_ACCEPTED_DRAFT_TOKENS: accepted,
        NUM_DRAFT_TOKENS: drafted,
    }
    hist = [int(x) for x in outputs.get(n.ACCEPTED_LENGTH_HISTOGRAM) or []]
    if not hist:  # no histogram (an in-engine request the BLS could not split into steps): no step count
        return out
    steps = sum(hist)
    # zero steps (k = 0, or a policy that never drafted): 1.0, nothing accepted, as vLLM's compute_acceptance_len
    # answers for no drafts (vllm/v1/spec_decode/metrics.py)
    return {
        MEAN_ACCEPTANCE_LENGTH: 1.0 + accepted / steps if steps else 1.0,
        **out,
        ACCEPTANCE_HISTOGRAM: hist,
        NUM_SPEC_STEPS: steps,
        NUM_SPEC_TOKENS: len(hist) - 1,
    }


# runtime llmapi (records/llmapi_contract.py): the LLM-API model's perf outputs on its responses (with
# sampling_param_return_perf_metrics), strings as MODEL encodes them: total_accepted_draft_tokens, total_draft_tokens,
# acceptance_rate. No per-step histogram and no count of verify steps, so only the counts and the rate are sent (as
# for an in-engine request without one; AIPerf shows no Spec Decode section without the histogram), never invented
# steps. On TensorRT-LLM 1.2.1's PyTorch flow they are 0 whether or not drafting ran (lc.SPEC_PERF_ZERO,
# NVIDIA/TensorRT-LLM#17082; the CPU stand-in answers 0 too): sent as the model returned them, and where the model
# reports nothing drafted although its model.yaml has a speculative_config, `metrics` says so beside them
# (LLMAPI_NOTE_KEY; never inside speculative_decoding, whose keys are vLLM's).
LLMAPI_SPEC_OUTPUTS = ("total_accepted_draft_tokens", "total_draft_tokens", "acceptance_rate")
LLMAPI_NOTE_KEY = "trt_spec_acceptance_note"  # under the body's top-level "metrics", beside SPEC_DECODE_KEY
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
    """(vLLM's `metrics.speculative_decoding` from the LLM-API model's perf outputs, the note for `metrics` or None).
    (None, None) when the responses carried no readable counts (a request the frontend cut at a stop string)."""
    accepted, drafted, rate = (_perf_number(outputs.get(name)) for name in LLMAPI_SPEC_OUTPUTS)
    if accepted is None or drafted is None or accepted < 0 or drafted < 0:
        return None, None
    if rate is None or not math.isfinite(rate):  # not readable: the rate of the counts
        rate = accepted / drafted if drafted else 0.0
    out = {
        DRAFT_ACCEPTANCE_RATE: rate,
        NUM_ACCEPTED_DRAFT_TOKENS: int(accepted),
        NUM_DRAFT_TOKENS: int(drafted),
    }
    return out, LLMAPI_ZERO_NOTE if drafted == 0 else None
