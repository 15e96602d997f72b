"""`trt-spec bench` / `trt-spec tune` against a served deployment: paired A/B in one run.

Baseline (`ensemble`) and speculative (`tensorrt_llm_bls`) alternate per request after a warm-up, both
streaming (so TTFT is measured), greedy, same prompt and parameters. Per request: TTFT, TPOT, end-to-end
latency, output tokens/s; per run: mean acceptance length, acceptance rate, per-position acceptance and
the accepted-length histogram (summed from the BLS's whole-request metrics), and the speedup (baseline
latency / speculative latency over the same tokens) with a paired bootstrap 95% interval. A concurrency
sweep (1, 2, 4, 8 in flight) shows where speculation stops paying; `tune` sweeps k and recommends one.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..names import ACCEPTED_LENGTH_HISTOGRAM, BASELINE, NUM_DRAFT_TOKENS, SPECULATIVE, TOTAL_STEPS
from .client import Generation, LLMClient
from .metrics import Summary, bootstrap_ratio_ci, low_acceptance_advice, tpot
from .prompts import Prompt

Progress = Optional[Callable[[int, int], None]]


@dataclass
class Sample:
    model: str
    prompt: int
    repeat: int
    tokens: int
    ttft_s: float
    latency_s: float
    tpot_s: Optional[float]
    accepted: int = 0
    drafted: int = 0
    steps: int = 0
    histogram: Optional[list[int]] = None

    @staticmethod
    def of(model: str, i: int, r: int, g: Generation) -> "Sample":
        m = g.metrics
        return Sample(model, i, r, g.num_tokens, g.ttft_s, g.latency_s, tpot(g.latency_s, g.ttft_s, g.num_tokens),
                      int(m.get("total_accepted_draft_tokens", 0)), int(m.get("total_draft_tokens", 0)),
                      int(m.get(TOTAL_STEPS, 0)), m.get(ACCEPTED_LENGTH_HISTOGRAM))


def _request(client: LLMClient, model: str, p: Prompt, k: Optional[int]) -> Generation:
    extra = {NUM_DRAFT_TOKENS: k} if (model == SPECULATIVE and k is not None) else {}
    return client.generate(model, p.text, p.max_tokens, stream=True, exclude_input_in_output=True, temperature=0.0,
                           **extra)


def acceptance_summary(spec: Sequence[Sample]) -> dict:
    accepted = sum(s.accepted for s in spec)
    drafted = sum(s.drafted for s in spec)
    steps = sum(s.steps for s in spec)
    hists = [s.histogram for s in spec if s.histogram]
    width = max((len(h) for h in hists), default=0)
    hist = [sum(h[i] for h in hists if i < len(h)) for i in range(width)]
    k = width - 1
    # per position i: among steps, the fraction whose accepted count exceeded i (drafts ran k deep)
    per_pos = [sum(hist[i + 1:]) / steps if steps else 0.0 for i in range(max(k, 0))]
    return {"accepted": accepted, "drafted": drafted, "steps": steps,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": 1 + accepted / steps if steps else 0.0,
            "histogram": hist, "per_position_acceptance": per_pos}


def paired_ab(client: LLMClient, prompts: Sequence[Prompt], *, k: Optional[int] = None, repeats: int = 1,
              warmup: int = 1, progress: Progress = None) -> dict:
    for p in prompts[:warmup]:
        _request(client, BASELINE, p, k)
        _request(client, SPECULATIVE, p, k)
    samples: list[Sample] = []
    total = len(prompts) * repeats
    done = 0
    for r in range(repeats):
        for i, p in enumerate(prompts):
            order = (BASELINE, SPECULATIVE) if (i + r) % 2 == 0 else (SPECULATIVE, BASELINE)
            for model in order:
                samples.append(Sample.of(model, i, r, _request(client, model, p, k)))
            done += 1
            if progress:
                progress(done, total)
    return summarize(samples, k)


def summarize(samples: Sequence[Sample], k: Optional[int]) -> dict:
    base = [s for s in samples if s.model == BASELINE]
    spec = [s for s in samples if s.model == SPECULATIVE]
    pairs = {(s.prompt, s.repeat): s for s in base}
    b_lat, s_lat = [], []
    for s in spec:
        b = pairs.get((s.prompt, s.repeat))
        if b is not None:
            b_lat.append(b.latency_s)
            s_lat.append(s.latency_s)
    speedup, lo, hi = bootstrap_ratio_ci(b_lat, s_lat)
    acc = acceptance_summary(spec)

    def side(xs: Sequence[Sample]) -> dict:
        return {"ttft_s": Summary.of([x.ttft_s for x in xs]).__dict__,
                "tpot_s": Summary.of([x.tpot_s for x in xs]).__dict__,
                "latency_s": Summary.of([x.latency_s for x in xs]).__dict__,
                "tokens_per_s": sum(x.tokens for x in xs) / sum(x.latency_s for x in xs),
                "tokens": sum(x.tokens for x in xs)}

    out = {"k": k, "requests": len(spec), "speedup": speedup, "speedup_ci95": [lo, hi],
           "baseline": side(base), "speculative": side(spec), "acceptance": acc,
           "samples": [s.__dict__ for s in samples]}
    kk = k if k is not None else max(len(acc["histogram"]) - 1, 0)
    out["warning"] = low_acceptance_advice(_alpha_from(acc, kk), kk, 0.0, speedup)
    return out


def _alpha_from(acc: dict, k: int) -> float:
    from .inprocess import solve_alpha

    return solve_alpha(acc["mean_acceptance_length"], k)


def concurrency_sweep(client_factory: Callable[[], LLMClient], prompts: Sequence[Prompt], levels: Sequence[int], *,
                      k: Optional[int] = None, requests_per_level: Optional[int] = None,
                      progress: Progress = None) -> list[dict]:
    """At each level, N requests with C in flight, baseline then speculative: throughput and latency."""
    rows = []
    total = len(levels) * 2
    step = 0
    for c in levels:
        n = requests_per_level or max(c, len(prompts))
        work = [prompts[i % len(prompts)] for i in range(n)]
        row = {"concurrency": c, "requests": n}
        for model in (BASELINE, SPECULATIVE):
            def one(p: Prompt, model=model) -> Generation:
                cl = client_factory()
                try:
                    return _request(cl, model, p, k)
                finally:
                    cl.close()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                gens = list(pool.map(one, work))
            wall = time.perf_counter() - t0
            row[model] = {"tokens_per_s": sum(g.num_tokens for g in gens) / wall, "wall_s": wall,
                          "latency_p50_s": statistics.median(g.latency_s for g in gens),
                          "ttft_p50_s": statistics.median(g.ttft_s for g in gens)}
            step += 1
            if progress:
                progress(step, total)
        row["speedup"] = row[SPECULATIVE]["tokens_per_s"] / row[BASELINE]["tokens_per_s"]
        rows.append(row)
    return rows


def tune_k(client: LLMClient, prompts: Sequence[Prompt], ks: Sequence[int], *, repeats: int = 1,
           progress: Progress = None) -> dict:
    rows = []
    for i, k in enumerate(ks):
        res = paired_ab(client, prompts, k=k, repeats=repeats, warmup=1 if i == 0 else 0)
        rows.append({"k": k, "speedup": res["speedup"], "speedup_ci95": res["speedup_ci95"],
                     "acceptance_rate": res["acceptance"]["acceptance_rate"],
                     "mean_acceptance_length": res["acceptance"]["mean_acceptance_length"],
                     "spec_tokens_per_s": res["speculative"]["tokens_per_s"],
                     "baseline_tokens_per_s": res["baseline"]["tokens_per_s"]})
        if progress:
            progress(i + 1, len(ks))
    best = max(rows, key=lambda r: r["speedup"])
    return {"sweep": rows, "recommended_k": best["k"] if best["speedup"] > 1.0 else 0,
            "note": ("speculation does not pay at any k on this workload; serve the baseline (k=0)"
                     if best["speedup"] <= 1.0 else f"k={best['k']} gives {best['speedup']:.2f}x")}
