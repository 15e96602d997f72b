"""trt_spec.in_triton.spec_metrics without Triton: what the BLS publishes per finished request (a fake of the python
backend's MetricFamily records it; tests/e2e/test_spec_metrics.py checks the real one against a real tritonserver), that
publishing never fails a request, and the Prometheus text parser the demo and the e2e test read it with."""

from __future__ import annotations

import asyncio
import math

import pytest

from trt_spec.in_triton.spec_metrics import (
    LATENCY_BUCKETS,
    MetricSample,
    SpecMetricsExporter,
    histogram,
    parse_metrics,
    scraped_acceptance,
    value,
)
from trt_spec.in_triton.speculative_loop import LoopStats, Round
from trt_spec.records import names as n


class FakeMetricFamily:
    """The python backend's custom metrics API as 24.10 has it (pb_utils.MetricFamily and its Metric)."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: list["FakeMetricFamily"] = []
    fail_on: set[str] = set()

    def __init__(self, name, description, kind):
        if name in self.fail_on:
            raise RuntimeError("metrics disabled")
        self.name, self.description, self.kind, self.metrics = name, description, kind, []
        FakeMetricFamily.created.append(self)

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the backend's name
        if (buckets is None) == (self.kind == self.HISTOGRAM) or (
            buckets is not None and not isinstance(buckets, list)
        ):
            raise RuntimeError("Failed to create metric. Missing required buckets / Unexpected buckets found.")
        m = FakeMetric(self.kind, labels, buckets)
        self.metrics.append(m)
        return m


class FakeMetric:
    def __init__(self, kind, labels, buckets):
        self.kind, self.labels, self.buckets, self.total, self.observed = kind, labels, buckets, 0.0, []

    def increment(self, v):  # a counter only goes up; a gauge either way (python backend 24.10 Metric.increment)
        assert self.kind == "gauge" or (self.kind == "counter" and v >= 0)
        self.total += v

    def set(self, v):
        assert self.kind == "gauge"
        self.total = v

    def observe(self, v):
        assert self.kind == "histogram"
        self.observed.append(v)


class FakePbUtils:
    MetricFamily = FakeMetricFamily


@pytest.fixture(autouse=True)
def fresh():
    FakeMetricFamily.created, FakeMetricFamily.fail_on = [], set()


def metric(name):
    (family,) = [f for f in FakeMetricFamily.created if f.name == name]
    (m,) = family.metrics
    return m


def request_metrics() -> LoopStats:
    rounds = [
        Round(k=4, drafted=4, accepted=2, tokens=3, draft_s=0.001, target_s=0.02),
        Round(k=0, drafted=0, accepted=0, tokens=1, draft_s=0.0, target_s=0.01),
        Round(k=4, drafted=3, accepted=3, tokens=4, draft_s=0.002, target_s=0.03),
    ]
    return LoopStats(drafted=7, accepted=5, steps=3, hist=[1, 0, 1, 1, 0], rounds=rounds)


def test_loop_mode_publishes_every_metric_with_model_and_mode_labels():
    sm = SpecMetricsExporter(FakePbUtils, "tensorrt_llm_bls", "ngram", 4)
    kinds = {f.name: f.kind for f in FakeMetricFamily.created}
    assert kinds == {
        n.METRIC_REQUESTS: "counter",
        n.METRIC_DRAFT_TOKENS: "counter",
        n.METRIC_ACCEPTED_TOKENS: "counter",
        n.METRIC_ROUNDS: "counter",
        n.METRIC_ROUNDS_NO_SPEC: "counter",
        n.METRIC_ACCEPTED_LENGTH: "histogram",
        n.METRIC_DRAFT_LENGTH: "histogram",
        n.METRIC_DRAFT_LATENCY: "histogram",
        n.METRIC_VERIFY_LATENCY: "histogram",
        n.METRIC_IN_FLIGHT: "gauge",
        n.VLLM_NUM_DRAFTS: "counter",
        n.VLLM_NUM_DRAFT_TOKENS: "counter",
        n.VLLM_NUM_ACCEPTED_TOKENS: "counter",
        n.VLLM_NUM_ACCEPTED_PER_POS: "counter",
    }
    assert all(
        m.labels == {"model": "tensorrt_llm_bls", "mode": "ngram"}
        for f in FakeMetricFamily.created
        if not f.name.startswith("vllm:")
        for m in f.metrics
    )
    assert metric(n.VLLM_NUM_DRAFTS).labels == {"model_name": "tensorrt_llm_bls", "engine": "0"}  # vLLM's labels
    assert metric(n.METRIC_ACCEPTED_LENGTH).buckets == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert metric(n.METRIC_DRAFT_LENGTH).buckets == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert metric(n.METRIC_VERIFY_LATENCY).buckets == list(LATENCY_BUCKETS)

    sm.observe(request_metrics())
    sm.observe(request_metrics())
    assert metric(n.METRIC_REQUESTS).total == 2
    assert metric(n.METRIC_DRAFT_TOKENS).total == 14
    assert metric(n.METRIC_ACCEPTED_TOKENS).total == 10
    assert metric(n.METRIC_ROUNDS).total == 6
    assert metric(n.METRIC_ROUNDS_NO_SPEC).total == 2
    assert metric(n.METRIC_ACCEPTED_LENGTH).observed == [2, 3] * 2  # rounds that speculated
    assert metric(n.METRIC_DRAFT_LENGTH).observed == [4, 0, 4] * 2
    assert metric(n.METRIC_DRAFT_LATENCY).observed == [0.001, 0.0, 0.002] * 2
    assert metric(n.METRIC_VERIFY_LATENCY).observed == [0.02, 0.01, 0.03] * 2
    # vLLM's names: a draft is a speculative round; per position, the rounds that accepted that position's token
    assert metric(n.VLLM_NUM_DRAFTS).total == 4
    assert (metric(n.VLLM_NUM_DRAFT_TOKENS).total, metric(n.VLLM_NUM_ACCEPTED_TOKENS).total) == (14, 10)
    (per_pos,) = [f for f in FakeMetricFamily.created if f.name == n.VLLM_NUM_ACCEPTED_PER_POS]
    assert {m.labels["position"]: m.total for m in per_pos.metrics} == {"0": 4, "1": 4, "2": 2, "3": 0}
    # vLLM's mean acceptance length, 1 + accepted / drafts, is the one definition's (records/speculation.py)
    assert 1 + metric(n.VLLM_NUM_ACCEPTED_TOKENS).total / metric(n.VLLM_NUM_DRAFTS).total == 3.5
    sm.in_flight(+1), sm.in_flight(+1), sm.in_flight(-1)  # the drain's gauge, in order on the metrics thread
    sm.close()
    assert metric(n.METRIC_IN_FLIGHT).total == 1


def test_engine_mode_has_no_rounds():
    sm = SpecMetricsExporter(FakePbUtils, "tensorrt_llm_bls", "engine", 63)
    assert {f.name for f in FakeMetricFamily.created} == {
        n.METRIC_REQUESTS,
        n.METRIC_DRAFT_TOKENS,
        n.METRIC_ACCEPTED_TOKENS,
        n.METRIC_IN_FLIGHT,
        n.VLLM_NUM_DRAFT_TOKENS,
        n.VLLM_NUM_ACCEPTED_TOKENS,
    }
    sm.observe(LoopStats(drafted=40, accepted=25, steps=15))
    assert (
        metric(n.METRIC_REQUESTS).total,
        metric(n.METRIC_DRAFT_TOKENS).total,
        metric(n.METRIC_ACCEPTED_TOKENS).total,
    ) == (1, 40, 25)


def test_engine_mode_with_streamed_steps_publishes_them_as_vllm_drafts():
    """engine_steps (the BLS streams its engine call): the request's histogram is its verify steps: the accepted-length
    histogram per step, vLLM's drafts and per-position counters, consistent with the response's histogram."""
    sm = SpecMetricsExporter(FakePbUtils, "tensorrt_llm_bls", "engine", 4, engine_steps=True)
    names = {f.name for f in FakeMetricFamily.created}
    assert {n.METRIC_ACCEPTED_LENGTH, n.VLLM_NUM_DRAFTS, n.VLLM_NUM_ACCEPTED_PER_POS} <= names
    assert n.METRIC_ROUNDS not in names
    sm.observe(LoopStats(drafted=16, accepted=8, steps=9, hist=[1, 0, 1, 2, 0]))
    sm.observe(LoopStats(drafted=4, accepted=1, steps=3))  # steps not shown (no histogram): tokens only
    assert metric(n.METRIC_ACCEPTED_LENGTH).observed == [0, 2, 3, 3]
    assert (metric(n.VLLM_NUM_DRAFTS).total, metric(n.VLLM_NUM_ACCEPTED_TOKENS).total) == (4, 9)
    (per_pos,) = [f for f in FakeMetricFamily.created if f.name == n.VLLM_NUM_ACCEPTED_PER_POS]
    assert {m.labels["position"]: m.total for m in per_pos.metrics} == {"0": 3, "1": 3, "2": 2, "3": 0}


def test_publishing_never_fails_the_model_or_a_request():
    FakeMetricFamily.fail_on = {n.METRIC_ROUNDS}
    errors = []
    sm = SpecMetricsExporter(FakePbUtils, "bls", "draft_target", 4, errors.append)  # loads without that one metric
    assert errors == ["bls: metric trt_spec_rounds_total not published: RuntimeError: metrics disabled"]
    sm.observe(request_metrics())
    assert metric(n.METRIC_REQUESTS).total == 1  # the others still count

    def broken(v):
        raise RuntimeError("Failed to observe metric value: stub gone")

    metric(n.METRIC_DRAFT_LENGTH).observe = broken
    sm.observe(request_metrics())  # logged, not raised
    assert "Failed to observe metric value" in errors[-1]


def test_publish_runs_on_the_metrics_thread_and_close_stops_it():
    errors = []
    sm = SpecMetricsExporter(FakePbUtils, "bls", "ngram", 4, errors.append)
    asyncio.run(sm.publish(request_metrics()))
    assert metric(n.METRIC_REQUESTS).total == 1
    sm.close()
    asyncio.run(sm.publish(request_metrics()))  # after finalize: logged, not raised
    assert len(errors) == 1 and "not published" in errors[0]


EXPOSITION = r"""# HELP trt_spec_requests_total Finished requests
# TYPE trt_spec_requests_total counter
trt_spec_requests_total{mode="ngram",model="tensorrt_llm_bls"} 3
trt_spec_requests_total{mode="draft_target",model="other"} 5 1700000000000
trt_spec_draft_tokens_total{mode="ngram",model="tensorrt_llm_bls"} 40
trt_spec_accepted_draft_tokens_total{mode="ngram",model="tensorrt_llm_bls"} 10
trt_spec_rounds_total{mode="ngram",model="tensorrt_llm_bls"} 20
trt_spec_rounds_without_speculation_total{mode="ngram",model="tensorrt_llm_bls"} 5
trt_spec_accepted_length_bucket{mode="ngram",model="tensorrt_llm_bls",le="0"} 12
trt_spec_accepted_length_bucket{mode="ngram",model="tensorrt_llm_bls",le="1"} 16
trt_spec_accepted_length_bucket{mode="ngram",model="tensorrt_llm_bls",le="+Inf"} 20
nv_inference_count{model="odd \"name\" \\ here",version="1"} 7
process_up 1e+00
"""


def test_parse_the_text_exposition_format():
    samples = parse_metrics(EXPOSITION)
    assert len(samples) == 11
    assert value(samples, n.METRIC_REQUESTS) == 8
    assert value(samples, n.METRIC_REQUESTS, model="tensorrt_llm_bls") == 3
    assert value(samples, "nv_inference_count", model='odd "name" \\ here') == 7
    assert value(samples, "process_up") == 1.0 and value(samples, "absent") == 0
    assert histogram(samples, n.METRIC_ACCEPTED_LENGTH) == {0.0: 12, 1.0: 16, math.inf: 20}
    with pytest.raises(ValueError, match="not a Prometheus sample line"):
        parse_metrics("what {")


def test_acceptance_summary():
    s = scraped_acceptance(parse_metrics(EXPOSITION))
    # one definition (trt_spec.records.speculation): 1 + accepted / speculative rounds, the 5 rounds without
    # speculation apart; the bench's key set, plus the two keys demo's server_metrics had before it (rounds,
    # no_speculation_share)
    assert s == {
        "requests": 3,
        "drafted": 40,
        "accepted": 10,
        "acceptance_rate": 0.25,
        "steps": 20,
        "speculative_rounds": 15,
        "rounds_without_speculation": 5,
        "rounds_without_speculation_share": 0.25,
        "mean_acceptance_length": pytest.approx(1 + 10 / 15),
        "histogram": [12, 4],
        "per_position_acceptance": [pytest.approx(4 / 15)],
        "draft_length_counts": [],
        "mean_draft_length": 0.0,
        "source": None,
        "notes": [],
        "rounds": 20,
        "no_speculation_share": 0.25,
    }
    empty = scraped_acceptance([])
    assert empty["requests"] == 0 and empty["acceptance_rate"] is None and empty["no_speculation_share"] is None
    assert empty["mean_acceptance_length"] is None and empty["rounds_without_speculation_share"] == 0.0


def test_the_two_samples_are_two_names():
    """A Prometheus sample line and a measured bench request were both `Sample`."""
    from trt_spec.harness.bench import RequestSample

    assert MetricSample is not RequestSample and parse_metrics("x 1") == [MetricSample("x", {}, 1.0)]


def test_engine_request_metrics_are_the_backends_gauges():
    """nv_trt_llm_request_metrics as the tensorrtllm backend publishes them: one gauge per request_type labelled
    with model and version, set from the engine's counts (waiting = active - scheduled)."""
    from trt_spec.in_triton.engine_metrics import EngineMetricsExporter
    from trt_spec.records import backend_contract as bc
    from trt_spec.reference.batching import RequestCounts

    now = [RequestCounts(active=3, max=8, scheduled=2, context=1)]
    em = EngineMetricsExporter(FakePbUtils, "tensorrt_llm", "1", lambda: now[0], period_s=3600)
    em.update()
    (family,) = FakeMetricFamily.created
    assert (family.name, family.kind) == (bc.REQUEST_METRICS, "gauge")
    got = lambda: {m.labels["request_type"]: m.total for m in family.metrics}  # noqa: E731
    assert {m.labels["model"] for m in family.metrics} == {"tensorrt_llm"} and got() == {
        "active": 3,
        "max": 8,
        "scheduled": 2,
        "context": 1,
        "waiting": 1,
    }
    now[0] = RequestCounts(active=0, max=8, scheduled=0, context=0)
    em.update()
    assert got()["active"] == 0 and got()["waiting"] == 0
    em.close()
