"""Speculation metrics in Prometheus: what the BLS publishes, and reading them back from Triton's /metrics.

The python backend's metrics API has real histograms (upstream-facts: triton-python-histogram-metrics).
Each metric update is a synchronous message to the server, so a request is published once, when finished, from one
thread of its own: a python-backend Metric is not thread-safe (upstream-facts: triton-python-metric-not-threadsafe).
The accepted-length histogram's _count + rounds without speculation = rounds. Engine mode has no rounds; its verify
steps come from each request's accepted_length_histogram when the engine call streams. The BLS passes
triton_python_backend_utils in (it exists only inside a stub).
"""

from __future__ import annotations

import asyncio
import math
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..records.names import (
    BLS,
    METRIC_ACCEPTED_LENGTH,
    METRIC_ACCEPTED_TOKENS,
    METRIC_CACHE_ACCEPTED,
    METRIC_CACHE_ROUNDS,
    METRIC_CACHE_TOKENS,
    METRIC_DRAFT_LATENCY,
    METRIC_DRAFT_LENGTH,
    METRIC_DRAFT_TOKENS,
    METRIC_IN_FLIGHT,
    METRIC_REQUESTS,
    METRIC_ROUNDS,
    METRIC_ROUNDS_NO_SPEC,
    METRIC_VERIFY_LATENCY,
    VLLM_NUM_ACCEPTED_PER_POS,
    VLLM_NUM_ACCEPTED_TOKENS,
    VLLM_NUM_DRAFT_TOKENS,
    VLLM_NUM_DRAFTS,
)
from ..records.speculation import LOOP_MODES, AcceptanceCounts, acceptance_summary
from .speculative_loop import LoopStats

# Seconds per round, from n-gram proposals to the CPU reference engine; Prometheus adds +Inf.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def length_buckets(max_draft_len: int) -> list[float]:
    """Integer histograms (accepted length, k chosen): one bucket per value 0..max_draft_len."""
    return [float(i) for i in range(max_draft_len + 1)]


class SpecMetricsExporter:
    """The BLS's Prometheus metrics for one model: `await publish(m)` per finished request, `close()` at finalize.

    Publishing never fails a request or the load: a failure is logged and the metric skipped."""

    def __init__(
        self,
        pb_utils: Any,
        model: str,
        mode: str,
        max_draft_len: int,
        log_error: Callable[[str], None] = print,
        *,
        suffix_cache: bool = False,
        engine_steps: bool = False,
    ):
        self.log_error = log_error
        self.rounds = mode in LOOP_MODES
        self.engine_steps = not self.rounds and engine_steps
        self._families: list = []
        self._m: dict[str, Any] = {}  # name -> Metric (the only references: close() deletes them first)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="spec-metrics")
        labels = {"model": model, "mode": mode}
        counter, histogram = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
        lengths = length_buckets(max_draft_len)
        published = [
            (METRIC_REQUESTS, "Finished requests of the speculative model", counter, None),
            (METRIC_DRAFT_TOKENS, "Draft tokens proposed", counter, None),
            (METRIC_ACCEPTED_TOKENS, "Draft tokens accepted by the target", counter, None),
        ]
        if self.rounds:
            published += [
                (METRIC_ROUNDS, "Target calls of the speculative loop (rounds)", counter, None),
                (METRIC_ROUNDS_NO_SPEC, "Rounds whose chosen draft length k was 0", counter, None),
                (METRIC_ACCEPTED_LENGTH, "Accepted draft tokens per round with a draft (k > 0)", histogram, lengths),
                (METRIC_DRAFT_LENGTH, "Draft length k chosen per round", histogram, lengths),
                (METRIC_DRAFT_LATENCY, "Seconds proposing the draft, per round", histogram, list(LATENCY_BUCKETS)),
                (METRIC_VERIFY_LATENCY, "Seconds of the target call, per round", histogram, list(LATENCY_BUCKETS)),
            ]
        elif self.engine_steps:
            published.append(
                (METRIC_ACCEPTED_LENGTH, "Accepted draft tokens per engine verify step with drafts", histogram, lengths)
            )
        published.append(
            (METRIC_IN_FLIGHT, "Requests the speculative model holds now", pb_utils.MetricFamily.GAUGE, None)
        )
        if suffix_cache:
            published += [
                (METRIC_CACHE_ROUNDS, "Rounds whose proposal drew on earlier requests (suffix cache)", counter, None),
                (METRIC_CACHE_ACCEPTED, "Draft tokens accepted in those rounds", counter, None),
                (METRIC_CACHE_TOKENS, "Tokens the suffix cache holds", pb_utils.MetricFamily.GAUGE, None),
            ]
        for name, description, kind, buckets in published:
            try:
                family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
                self._families.append(family)
                self._m[name] = (
                    family.Metric(labels=labels) if buckets is None else family.Metric(labels=labels, buckets=buckets)
                )
            except Exception as e:  # noqa: BLE001 - e.g. a server without metrics: serve anyway
                log_error(f"{model}: metric {name} not published: {type(e).__name__}: {e}")
        self.positions = max_draft_len if self.rounds or self.engine_steps else 0
        self._register_vllm(pb_utils, model)

    def _register_vllm(self, pb_utils: Any, model: str) -> None:
        """The same counts under vLLM's names."""
        counter = pb_utils.MetricFamily.COUNTER
        vllm = {"model_name": model, "engine": "0"}
        vllm_published = [
            (VLLM_NUM_DRAFT_TOKENS, "Draft tokens proposed", [None]),
            (VLLM_NUM_ACCEPTED_TOKENS, "Draft tokens accepted", [None]),
        ]
        if self.positions:
            vllm_published += [
                (VLLM_NUM_DRAFTS, "Speculative rounds (drafts)", [None]),
                (
                    VLLM_NUM_ACCEPTED_PER_POS,
                    "Speculative rounds that accepted the draft token at each position",
                    list(range(self.positions)),
                ),
            ]
        for name, description, positions in vllm_published:
            try:
                family = pb_utils.MetricFamily(name=name, description=description, kind=counter)
                self._families.append(family)
                for pos in positions:
                    key = name if pos is None else f"{name}/{pos}"
                    self._m[key] = family.Metric(labels=vllm if pos is None else {**vllm, "position": str(pos)})
            except Exception as e:  # noqa: BLE001
                self.log_error(f"{model}: metric {name} not published: {type(e).__name__}: {e}")

    def in_flight(self, delta: int) -> None:
        """A request starts (+1) or ends (-1): the gauge serve's drain waits on (queued in order; never raises)."""
        try:
            self._thread.submit(self._inc_gauge, METRIC_IN_FLIGHT, delta)
        except RuntimeError:  # closed: unloading
            pass

    def _inc_gauge(self, name: str, delta: float) -> None:
        try:
            metric = self._m.get(name)
            if metric is not None:
                metric.increment(float(delta))
        except Exception as e:  # noqa: BLE001 - metrics must not cost a client its answer
            self.log_error(f"{name} not updated: {type(e).__name__}: {e}")

    async def publish(self, m: LoopStats) -> None:
        """observe(m) on the metrics thread; returns when the server has the figures (never raises)."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._thread, self.observe, m)
        except RuntimeError as e:  # closed: unloading
            self.log_error(f"speculation metrics not published for a request: {e}")

    def observe(self, m: LoopStats) -> None:
        """Publish one finished request (never raises). Call from one thread at a time."""
        try:
            self._inc(METRIC_REQUESTS, 1)
            self._inc(METRIC_DRAFT_TOKENS, m.drafted)
            self._inc(METRIC_ACCEPTED_TOKENS, m.accepted)
            self._inc(VLLM_NUM_DRAFT_TOKENS, m.drafted)
            self._inc(VLLM_NUM_ACCEPTED_TOKENS, m.accepted)
            if self.engine_steps:
                self._engine_steps(m.hist)
            if not self.rounds:
                return
            speculative = [r for r in m.rounds if r.drafted]  # vLLM's "drafts"
            self._inc(VLLM_NUM_DRAFTS, len(speculative))
            for pos in range(self.positions):
                self._inc(f"{VLLM_NUM_ACCEPTED_PER_POS}/{pos}", sum(1 for r in speculative if r.accepted > pos))
            self._inc(METRIC_ROUNDS, len(m.rounds))
            self._inc(METRIC_ROUNDS_NO_SPEC, sum(1 for r in m.rounds if r.k == 0))
            for r in m.rounds:
                if r.k > 0:  # as the response's accepted_length_histogram
                    self._observe(METRIC_ACCEPTED_LENGTH, r.accepted)
                self._observe(METRIC_DRAFT_LENGTH, r.k)
                self._observe(METRIC_DRAFT_LATENCY, r.draft_s)
                self._observe(METRIC_VERIFY_LATENCY, r.target_s)
            self._inc(METRIC_CACHE_ROUNDS, sum(1 for r in m.rounds if r.cached))
            self._inc(METRIC_CACHE_ACCEPTED, sum(r.accepted for r in m.rounds if r.cached))
            gauge = self._m.get(METRIC_CACHE_TOKENS)
            if gauge is not None and m.cache_tokens is not None:
                gauge.set(float(m.cache_tokens))
        except Exception as e:  # noqa: BLE001 - metrics must not cost a client its answer
            self.log_error(f"speculation metrics not published for a request: {type(e).__name__}: {e}")

    def _engine_steps(self, hist: list[int]) -> None:
        """Engine mode: each verify step with drafts counts as a round that drafted."""
        self._inc(VLLM_NUM_DRAFTS, sum(hist))
        for pos in range(self.positions):
            self._inc(f"{VLLM_NUM_ACCEPTED_PER_POS}/{pos}", sum(hist[pos + 1 :]))
        for accepted, steps in enumerate(hist):
            for _ in range(steps):
                self._observe(METRIC_ACCEPTED_LENGTH, accepted)

    def close(self) -> None:
        """Delete the metrics, then their families, from finalize(); left to the GC they crash the stub.

        (upstream-facts: triton-python-metrics-delete-order)"""
        self._thread.shutdown(wait=True)  # updates under way finish first
        self._m.clear()
        self._families.clear()

    def _inc(self, name: str, value: float) -> None:
        metric = self._m.get(name)
        if metric is not None and value:  # skip a message for nothing
            metric.increment(float(value))

    def _observe(self, name: str, value: float) -> None:
        metric = self._m.get(name)
        if metric is not None:
            metric.observe(float(value))


# -- reading them back: Prometheus text exposition format
@dataclass(frozen=True)
class MetricSample:
    """One sample line of a Prometheus exposition."""

    name: str
    labels: dict[str, str]
    value: float


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|NaN)")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_metrics(text: str) -> list[MetricSample]:
    """Samples of a Prometheus text exposition (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or not _NUMBER.fullmatch(match.group(3)):
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        name, labels, number = match.groups()
        out.append(
            MetricSample(
                name,
                {k: re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group()], v) for k, v in _LABEL.findall(labels or "")},
                float(number),
            )
        )
    return out


def scrape(url: str, timeout_s: float = 10.0) -> list[MetricSample]:
    """GET url (http://HOST:METRICS_PORT/metrics) and parse it."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse_metrics(r.read().decode("utf-8"))


def value(samples: Iterable[MetricSample], name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0 when there is none)."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def histogram(samples: Iterable[MetricSample], name: str, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts {le: count} of histogram `name` (le = float("inf") for +Inf)."""
    out: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
            le = float(s.labels["le"])  # "+Inf" parses as inf
            out[le] = out.get(le, 0.0) + s.value
    return dict(sorted(out.items()))


def _per_value(cumulative: dict[float, float]) -> tuple[int, ...]:
    """Observations per value 0..K of an integer histogram (length_buckets) from its cumulative buckets."""
    out, below = [], 0.0
    for le, n in cumulative.items():  # sorted by le; +Inf holds nothing beyond K
        if math.isfinite(le):
            out.append(int(n - below))
            below = n
    return tuple(out)


def scraped_acceptance_counts(samples: list[MetricSample], model: str = BLS) -> AcceptanceCounts:
    """What the server counted for one model (all its modes), for records.speculation.acceptance_summary."""
    rounds = int(value(samples, METRIC_ROUNDS, model=model))
    no_spec = int(value(samples, METRIC_ROUNDS_NO_SPEC, model=model))
    hist = _per_value(histogram(samples, METRIC_ACCEPTED_LENGTH, model=model))
    return AcceptanceCounts(
        requests=int(value(samples, METRIC_REQUESTS, model=model)),
        accepted=int(value(samples, METRIC_ACCEPTED_TOKENS, model=model)),
        drafted=int(value(samples, METRIC_DRAFT_TOKENS, model=model)),
        steps=rounds,
        # engine mode has no rounds: count its histogram's verify steps
        speculative_rounds=rounds - no_spec if rounds else sum(hist),
        rounds_without_speculation=no_spec,
        histogram=hist,
        draft_length_counts=_per_value(histogram(samples, METRIC_DRAFT_LENGTH, model=model)),
    )


def scraped_acceptance(samples: list[MetricSample], model: str = BLS) -> dict:
    """acceptance_summary of one model's counters, plus rounds and no_speculation_share for demo's report.json."""
    c = scraped_acceptance_counts(samples, model)
    return {
        **acceptance_summary(c),
        "rounds": c.steps,
        "no_speculation_share": c.rounds_without_speculation / c.steps if c.steps else None,
    }
