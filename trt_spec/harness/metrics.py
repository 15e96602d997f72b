"""Metric math shared by the in-process and the served benchmarks (pure functions, unit-tested).

Definitions (vLLM's): mean acceptance length = 1 + accepted / steps; draft acceptance rate α =
accepted / drafted; per-position acceptance; histogram of accepted counts 0..k. TPOT = (end-to-end latency −
TTFT) / (output tokens − 1): time per output token after the first, per request (not the inter-token
latency between streamed chunks, which is bursty under speculation). Total throughput = generated tokens
of every request / wall time of the run that served them together (what a server delivers under load; not
the mean of per-request tokens/s).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence


def leviathan_bound(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected speedup of speculative decoding (Leviathan et al. 2023, Thm 3.8):
    S = (1 − α^(k+1)) / ((1 − α)(k·c + 1)), α = per-token acceptance rate, c = draft/target cost ratio.

    The theorem assumes verifying k + 1 tokens costs one target decode step (true on a GPU at small batch).
    verify_cost = r, the measured cost of that (k + 1)-token pass in decode steps, replaces the 1:
    S_r = (1 − α^(k+1)) / ((1 − α)(k·c + r)), the bound for hardware where verification is not free."""
    if k <= 0:
        return 1.0
    return expected_tokens_per_step(alpha, k) / (k * c + verify_cost)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 − α^(k+1)) / (1 − α): mean tokens emitted per target pass for i.i.d. acceptance."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def break_even_acceptance(k: int, c: float, verify_cost: float = 1.0) -> float:
    """The acceptance rate (accepted / drafted) under which speculation at draft length k is slower than decoding.

    A round of k drafts costs k·c + r decode steps (c = draft/target cost per token, r = the verification pass in
    decode steps) and yields 1 + a·k tokens at acceptance rate a; it pays while 1 + a·k > k·c + r, so the break-even
    is a* = c + (r − 1) / k. No i.i.d. model is needed: it holds for the measured averages when every round drafts
    k. On a GPU at small batch r ≈ 1 and a* ≈ c; on a CPU r > 1 raises it."""
    if k <= 0:
        raise ValueError(f"k must be >= 1 for a break-even acceptance, got {k}")
    return c + (verify_cost - 1.0) / k


def mean_acceptance_length(accepted: int, steps: int) -> float:
    return 1.0 + accepted / steps if steps else 0.0


def acceptance_rate(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


def total_throughput(tokens: int, wall_s: float) -> float:
    """Generated tokens per second of wall time over requests served together (a concurrency level)."""
    if wall_s <= 0:
        raise ValueError(f"wall time must be > 0 s, got {wall_s}")
    return tokens / wall_s


def tpot(latency_s: float, ttft_s: float, output_tokens: int) -> Optional[float]:
    """Time per output token after the first; None for single-token outputs."""
    if output_tokens <= 1:
        return None
    return (latency_s - ttft_s) / (output_tokens - 1)


def bootstrap_ratio_ci(numer: Sequence[float], denom: Sequence[float], *, iters: int = 2000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float, float]:
    """Paired bootstrap of sum(numer)/sum(denom) (e.g. baseline time / speculative time = speedup).
    Returns (point estimate, low, high)."""
    if len(numer) != len(denom) or not numer:
        raise ValueError("bootstrap needs two paired, non-empty samples")
    n = len(numer)
    point = sum(numer) / sum(denom)
    rng = random.Random(seed)
    stats = []
    for _ in range(iters):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(denom[i] for i in idx)
        if d > 0:
            stats.append(sum(numer[i] for i in idx) / d)
    stats.sort()
    lo = stats[int((1 - level) / 2 * len(stats))]
    hi = stats[min(len(stats) - 1, int((1 + level) / 2 * len(stats)))]
    return point, lo, hi


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
        """Mean and linearly interpolated percentiles of the non-missing values (None/NaN dropped)."""
        v = [x for x in values if x is not None and not math.isnan(x)]
        if not v:
            return Summary(math.nan, math.nan, math.nan, 0)
        return Summary(statistics.fmean(v), percentile(v, 0.5), percentile(v, 0.9), len(v), percentile(v, 0.99))


def low_acceptance_advice(alpha: float, k: int, c: float, speedup: float) -> Optional[str]:
    """A plain warning when speculation does not pay (acceptance-rate degradation), else None."""
    if speedup >= 1.0 and alpha >= 0.3:
        return None
    bound = leviathan_bound(alpha, k, c)
    reasons = [f"acceptance α={alpha:.2f} at k={k}, draft/target cost c={c:.2f}, Leviathan bound {bound:.2f}x"]
    if speedup < 1.0:
        reasons.insert(0, f"speculative decoding is SLOWER than the baseline here ({speedup:.2f}x)")
    if bound < 1.0:
        reasons.append("even a perfectly efficient implementation cannot beat the baseline at this α and c")
    advice = ([f"lower num_draft_tokens (k={k})"] if k > 1 else []) + [
        "use a draft closer to the target (same family, distilled)",
        "use n-gram mode for prompts whose answers copy the prompt", "or disable speculation for this workload"]
    return "; ".join(reasons) + ". Advice: " + ", ".join(advice)
