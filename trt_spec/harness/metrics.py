"""Latency and throughput math shared by the benchmarks; speculation's own figures live in records/speculation.py.

TPOT is per request, not inter-chunk latency (bursty under speculation); total throughput is all tokens / wall time.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from ..records.speculation import leviathan_bound


def fmt(x: Optional[float], spec: str) -> str:
    """format(x, spec), or "n/a" in the same width for None."""
    if x is None:
        return format("n/a", re.sub(r"(\.\d+)?[a-z%]$", "", spec))
    return format(x, spec)


def total_throughput(tokens: int, wall_s: float) -> float:
    """Tokens per second of wall time over requests served together."""
    if wall_s <= 0:
        raise ValueError(f"wall time must be > 0 s, got {wall_s}")
    return tokens / wall_s


def tpot(latency_s: float, ttft_s: float, output_tokens: int) -> Optional[float]:
    """Time per output token after the first; None for single-token outputs."""
    if output_tokens <= 1:
        return None
    return (latency_s - ttft_s) / (output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    mean: float
    p50: float
    p90: float
    n: int
    p99: float = math.nan

    @staticmethod
    def of(values: Sequence[Optional[float]]) -> "Summary":
        """Mean and interpolated percentiles, None/NaN dropped."""
        v = [x for x in values if x is not None and not math.isnan(x)]
        if not v:
            return Summary(math.nan, math.nan, math.nan, 0)
        return Summary(statistics.fmean(v), percentile(v, 0.5), percentile(v, 0.9), len(v), percentile(v, 0.99))


def low_acceptance_advice(alpha: float, k: int, c: Optional[float], speedup: float) -> Optional[str]:
    """A warning when speculation does not pay, else None; c None (unmeasured) claims no bound."""
    if speedup >= 1.0 and alpha >= 0.3:
        return None
    bound = leviathan_bound(alpha, k, c) if c is not None else None
    cost = (
        f"draft/target cost c={c:.2f}, Leviathan bound {bound:.2f}x"
        if bound is not None
        else "draft/target cost unknown (not measured by the served bench; `bench in-process` measures it)"
    )
    reasons = [f"acceptance α={alpha:.2f} at k={k}, {cost}"]
    if speedup < 1.0:
        reasons.insert(0, f"speculative decoding is SLOWER than the baseline here ({speedup:.2f}x)")
    if bound is not None and bound < 1.0:
        reasons.append("even a perfectly efficient implementation cannot beat the baseline at this α and c")
    advice = ([f"lower num_draft_tokens (k={k})"] if k > 1 else []) + [
        "use a draft closer to the target (same family, distilled)",
        "use n-gram mode for prompts whose answers copy the prompt",
        "or disable speculation for this workload",
    ]
    return "; ".join(reasons) + ". Advice: " + ", ".join(advice)
