"""Speculation metrics in Prometheus: what the BLS publishes, and reading them back from Triton's /metrics.

The BLS publishes through the python backend's custom metrics API (Triton serves them on its metrics port with its
own). Triton 2.51 / python backend 24.10 has counters, gauges and histograms (HISTOGRAM since r24.08,
python_backend #374), so the histograms are real Prometheus histograms: `NAME_bucket{le=…}`, `NAME_sum`,
`NAME_count`. Every update is one synchronous message from the stub to the server process, so a request is
published once, when it has finished: one increment per counter and one observation per round per histogram
(≈20 µs each here: ≈3 ms for a 33-round request). They run on one thread of their own, awaited by the request:
the stub releases the GIL while it waits, so the event loop serves other requests meanwhile, and one thread
because a 24.10 Metric is not thread-safe (it keeps the value and its shared-memory handle in the object, outside
any lock: two threads updating one metric can send one value twice and lose the other).
The accepted-length histogram counts the rounds that speculated (k > 0, as the response's
accepted_length_histogram does): its _count + trt_spec_rounds_without_speculation_total = trt_spec_rounds_total.
Labels: model (the BLS as served), mode (draft_target | ngram | engine). In engine mode (Medusa, EAGLE,
lookahead: the engine drafts by itself) there are no rounds: requests, drafted and accepted tokens, and, when the BLS
streams its engine call (engine_steps: a decoupled deployment), the engine's verify steps from each request's
accepted_length_histogram (speculative_loop.engine_step_histogram): the accepted-length histogram per step, vLLM's
drafts and per-position counters. A request whose steps did not show (its histogram is empty) adds its tokens, not
its steps.

No module-level import of triton_python_backend_utils (it exists only inside a Triton stub): the BLS passes it in.
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

# Seconds per round: n-gram proposals take ~0.1 ms, a GPU draft or verify call a few ms to tens of ms, the CPU
# reference engine tens to hundreds of ms. Prometheus adds +Inf.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def length_buckets(max_draft_len: int) -> list[float]:
    """Integer histograms (accepted length, k chosen): one bucket per value 0..max_draft_len."""
    return [float(i) for i in range(max_draft_len + 1)]


class SpecMetricsExporter:
    """The BLS's exporter of its Prometheus metrics for one model (scrape() reads them back): `await publish(m)` (or
    `observe(m)`, blocking) once per finished request with the loop's LoopStats, `close()` at finalize.

    Publishing never fails a request or the model's load: a failure is logged (log_error) and the metric is
    skipped."""

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
        self.engine_steps = not self.rounds and engine_steps  # engine mode: steps from the response's histogram
        self._families: list = []
        self._m: dict[str, Any] = {}  # name -> Metric (the only references: close() deletes them first)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="spec-metrics")  # every update: see the module doc
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
        if suffix_cache:  # the loop's cross-request suffix cache is on (n-gram mode, suffix proposer)
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
        """vLLM's names (records/names.py): the same counts, for dashboards written for vLLM."""
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
        """A request starts (+1) or ends (-1): the gauge `trt_spec serve` reads to know when a drain is done (queued on
        the metrics thread, in order; never raises)."""
        try:
            self._thread.submit(self._inc_gauge, METRIC_IN_FLIGHT, delta)
        except RuntimeError:  # closed: the model is being unloaded
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
        except RuntimeError as e:  # closed (the model is being unloaded)
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
            speculative = [r for r in m.rounds if r.drafted]  # a draft, as vLLM counts them
            self._inc(VLLM_NUM_DRAFTS, len(speculative))
            for pos in range(self.positions):
                self._inc(f"{VLLM_NUM_ACCEPTED_PER_POS}/{pos}", sum(1 for r in speculative if r.accepted > pos))
            self._inc(METRIC_ROUNDS, len(m.rounds))
            self._inc(METRIC_ROUNDS_NO_SPEC, sum(1 for r in m.rounds if r.k == 0))
            for r in m.rounds:
                if r.k > 0:  # as the response's accepted_length_histogram: rounds that speculated
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
        """Engine mode: the request's verify steps (its histogram, steps with drafts only): as a round that drafted."""
        self._inc(VLLM_NUM_DRAFTS, sum(hist))
        for pos in range(self.positions):
            self._inc(f"{VLLM_NUM_ACCEPTED_PER_POS}/{pos}", sum(hist[pos + 1 :]))
        for accepted, steps in enumerate(hist):
            for _ in range(steps):
                self._observe(METRIC_ACCEPTED_LENGTH, accepted)

    def close(self) -> None:
        """Delete the metrics, then their families: the python backend needs that order, and left to the garbage
        collector at the stub's exit they crashed it (Triton 2.51: "Fatal Python error: Segmentation fault ...
        Garbage-collecting" in the server log). Call from the model's finalize()."""
        self._thread.shutdown(wait=True)  # updates under way finish first
        self._m.clear()
        self._families.clear()

    def _inc(self, name: str, value: float) -> None:
        metric = self._m.get(name)
        if metric is not None and value:  # a zero increment would be a message for nothing
            metric.increment(float(value))

    def _observe(self, name: str, value: float) -> None:
        metric = self._m.get(name)
        if metric is not None:
            metric.observe(float(value))


# -- reading them back: Prometheus text exposition format -------------------------------------------------------
@dataclass(frozen=True)
class MetricSample:
    """One sample line of a Prometheus exposition (not a bench request: that is harness.bench.RequestSample)."""

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
    """What the server counted for one model (all its modes), for records.speculation.acceptance_summary: requests,
    drafted and accepted tokens, rounds (steps), rounds without speculation (counted apart: speculative rounds = rounds
    - those), and the accepted-length and draft-length histograms per value."""
    rounds = int(value(samples, METRIC_ROUNDS, model=model))
    no_spec = int(value(samples, METRIC_ROUNDS_NO_SPEC, model=model))
    hist = _per_value(histogram(samples, METRIC_ACCEPTED_LENGTH, model=model))
    return AcceptanceCounts(
        requests=int(value(samples, METRIC_REQUESTS, model=model)),
        accepted=int(value(samples, METRIC_ACCEPTED_TOKENS, model=model)),
        drafted=int(value(samples, METRIC_DRAFT_TOKENS, model=model)),
        steps=rounds,
        # engine mode has no rounds: its verify steps with drafts are its accepted-length histogram's observations
        speculative_rounds=rounds - no_spec if rounds else sum(hist),
        rounds_without_speculation=no_spec,
        histogram=hist,
        draft_length_counts=_per_value(histogram(samples, METRIC_DRAFT_LENGTH, model=model)),
    )


def scraped_acceptance(samples: list[MetricSample], model: str = BLS) -> dict:
    """What the server says about speculation for one model: records.speculation.acceptance_summary of its counters
    (the bench's key set), plus the two keys this summary had before that one key set, which `trt-spec demo`'s
    report.json (server_metrics) carries: rounds (= steps) and no_speculation_share (None without rounds)."""
    c = scraped_acceptance_counts(samples, model)
    return {
        **acceptance_summary(c),
        "rounds": c.steps,
        "no_speculation_share": c.rounds_without_speculation / c.steps if c.steps else None,
    }
