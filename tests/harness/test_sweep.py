"""The concurrency sweep's aggregation on synthetic samples, and the sweep itself against a fake client:
total throughput over the level's wall time, per-request percentiles, speedup, acceptance, raw samples."""

import json
import math
import sys
import threading
import time

import pytest

from trt_spec.harness.bench import RequestSample, concurrency_sweep, level_side, sweep_row
from trt_spec.harness.client import Generation
from trt_spec.harness.metrics import Summary, percentile, total_throughput
from trt_spec.harness.prompts import Prompt
from trt_spec.harness.report import write_reports

BASE, SPEC = "ensemble", "tensorrt_llm_bls"


def test_total_throughput_is_tokens_over_wall_time():
    assert total_throughput(120, 2.0) == 60.0
    with pytest.raises(ValueError, match="wall time must be > 0 s, got 0"):
        total_throughput(10, 0.0)


def test_summary_p99_and_missing_values():
    v = list(range(1, 101))  # 1..100
    s = Summary.of([float(x) for x in v] + [None, math.nan])
    assert s.n == 100 and s.p50 == pytest.approx(50.5) and s.p99 == pytest.approx(percentile(v, 0.99))
    assert s.p99 == pytest.approx(99.01)
    assert Summary.of([2.0]).p99 == 2.0 and math.isnan(Summary.of([None]).p99)


def test_level_side_totals_over_wall_not_per_request():
    # two requests of 10 tokens, each 2 s long, served together in 2.5 s: 8 tok/s in total (not 5 per request)
    xs = [RequestSample(BASE, 0, 0, 10, 0.2, 2.0, 0.2), RequestSample(BASE, 1, 0, 10, 0.4, 2.0, None)]
    side = level_side(xs, 2.5)
    assert side["tokens_per_s"] == pytest.approx(8.0) and side["tokens"] == 20 and side["requests"] == 2
    assert side["ttft_s"]["p50"] == pytest.approx(0.3) and side["tpot_s"]["n"] == 1  # single-token TPOT dropped
    assert side["latency_s"]["p99"] == 2.0 and [s["prompt"] for s in side["samples"]] == [0, 1]


def test_sweep_row_speedup_and_acceptance():
    base = [RequestSample(BASE, i, 0, 20, 0.1, 2.0, 0.1) for i in range(2)]
    spec = [
        RequestSample(SPEC, 0, 0, 20, 0.1, 1.0, 0.05, accepted=10, drafted=16, steps=8, histogram=[2, 2, 4]),
        RequestSample(SPEC, 1, 0, 20, 0.1, 1.0, 0.05, accepted=2, drafted=8, steps=4, histogram=[2, 2, 0]),
    ]
    row = sweep_row(2, base, 4.0, spec, 1.6)
    assert row["concurrency"] == 2 and row["requests"] == 2
    assert row[BASE]["tokens_per_s"] == pytest.approx(10.0) and row[SPEC]["tokens_per_s"] == pytest.approx(25.0)
    assert row["speedup"] == pytest.approx(2.5)
    a = row["acceptance"]  # summed over the level's requests, then divided (metrics.py's definitions)
    assert a["acceptance_rate"] == pytest.approx(12 / 24) and a["mean_acceptance_length"] == pytest.approx(1 + 12 / 12)
    assert a["histogram"] == [4, 4, 4]


class FakeClient:
    """Answers after a fixed delay; records how many requests were in flight at once."""

    lock = threading.Lock()
    active = 0
    peak: dict = {}

    def __init__(self, level: list):
        self.level = level

    def generate(self, model, prompt, max_tokens, **params):
        with FakeClient.lock:
            FakeClient.active += 1
            key = (self.level[0], model)
            FakeClient.peak[key] = max(FakeClient.peak.get(key, 0), FakeClient.active)
        time.sleep(0.05)
        with FakeClient.lock:
            FakeClient.active -= 1
        metrics = (
            {
                "total_accepted_draft_tokens": 3,
                "total_draft_tokens": 4,
                "total_steps": 2,
                "accepted_length_histogram": [0, 1, 1],
            }
            if model == SPEC
            else {}
        )
        return Generation(
            text="x", output_ids=list(range(max_tokens)), ttft_s=0.005, latency_s=0.02, chunks=1, metrics=metrics
        )

    def close(self):
        pass


def test_sweep_runs_each_level_in_flight_and_keeps_samples():
    level = [0]
    seen = []

    def factory():
        return FakeClient(level)

    def progress(done, total):
        seen.append((done, total))
        if done % 2 == 0 and done < total:
            level[0] += 1

    prompts = [Prompt("a", 5), Prompt("b", 7), Prompt("c", 9)]
    rows = concurrency_sweep(factory, prompts, [1, 4], k=2, progress=progress)
    assert [r["concurrency"] for r in rows] == [1, 4] and [r["requests"] for r in rows] == [3, 4]
    assert FakeClient.peak[(0, BASE)] == 1 and FakeClient.peak[(1, SPEC)] == 4
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    r4 = rows[1]
    # 4 requests over 3 prompts: the 4th repeats prompt 0 as repeat 1
    assert [(s["prompt"], s["repeat"], s["tokens"]) for s in r4[SPEC]["samples"]] == [
        (0, 0, 5),
        (1, 0, 7),
        (2, 0, 9),
        (0, 1, 5),
    ]
    assert r4["acceptance"]["acceptance_rate"] == pytest.approx(0.75)
    assert r4["acceptance"]["mean_acceptance_length"] == pytest.approx(2.5)
    assert r4[BASE]["tokens"] == 26 and r4["speedup"] > 0
    # requests per level round up to a multiple of the level: 3 prompts at 2 in flight -> 4 requests
    assert [r["requests"] for r in concurrency_sweep(factory, prompts, [2], requests_per_level=3)] == [4]
    with pytest.raises(ValueError, match=r"concurrency levels must be >= 1, got \[0\]"):
        concurrency_sweep(factory, prompts, [1, 0])


def test_report_has_the_concurrency_table_samples_and_plots(tmp_path):
    rows = []
    for c, bw, sw in ((1, 4.0, 2.0), (4, 2.0, 1.6)):
        base = [RequestSample(BASE, i, 0, 20, 0.1, 2.0, 0.1) for i in range(2)]
        spec = [
            RequestSample(SPEC, i, 0, 20, 0.1, 1.0, 0.05, accepted=6, drafted=8, steps=4, histogram=[0, 2, 2])
            for i in range(2)
        ]
        rows.append(sweep_row(c, base, bw, spec, sw))
    files = write_reports({"title": "t", "concurrency": rows, "environment": {"time": "now"}}, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert (
        "| in flight | model | requests | total tok/s | TPOT p50 (ms) | latency p50 (s) | latency p99 (s) | "
        "TTFT p50 (ms) | speedup | acceptance rate | mean acceptance length |"
    ) in md
    assert "| 1 | ensemble | 2 | 10.0 | 100.0 | 2.00 | 2.00 | 100 | — | — | — |" in md
    assert "| 4 | tensorrt_llm_bls | 2 | 25.0 | 50.0 | 1.00 | 1.00 | 100 | **1.25x** | 0.75 | 2.50 |" in md
    rep = json.loads((tmp_path / "report.json").read_text())
    assert [len(r[m]["samples"]) for r in rep["concurrency"] for m in (BASE, SPEC)] == [2, 2, 2, 2]
    for png in ("speedup_vs_concurrency.png", "throughput_vs_concurrency.png"):
        assert tmp_path / png in files and (tmp_path / png).stat().st_size > 1000


def test_reports_without_matplotlib_are_written_and_say_why_there_are_no_charts(tmp_path, monkeypatch, capsys):
    """The NGC image may lack matplotlib: bench still writes its JSON and Markdown results, and says why no PNG."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    files = write_reports({"title": "t", "concurrency": [], "environment": {"time": "now"}}, tmp_path)
    assert files == [tmp_path / "report.json", tmp_path / "report.md"]
    assert "no PNG charts: matplotlib is not installed" in capsys.readouterr().err
