"""`trt-spec check`: is the speculative model's output the target's own output?

Greedy: every prompt goes through the baseline (`ensemble`) and the speculative model (`tensorrt_llm_bls`)
with identical parameters; token ids are compared (not only strings, which hide tokenization differences).
At the first divergence the baseline's top-2 logit margin is read from the engine (`tensorrt_llm` with
return_generation_logits, when the engine returns logits): a margin below `near_tie_margin` is a numerical
near-tie (batching/kernels may legitimately flip it), anything else is a real mismatch.

Sampling (temperature > 0): outputs are random, so identity is checked on distributions: for each prompt,
`samples` seeded generations of the first `dist_tokens` tokens from each model, compared with a chi-square
test of homogeneity; a p-value below `alpha` fails.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from ..records.defaults import SAMPLING_SAMPLES
from ..records.names import BASELINE, NUM_DRAFT_TOKENS, SPECULATIVE, TARGET
from .client import GREEDY, ClientError, LLMClient
from .prompts import Prompt

NEAR_TIE_MARGIN = 0.05  # logits; below this the two best tokens are a coin flip for any kernel change


@dataclass
class Divergence:
    index: int  # first differing position in the generated tokens
    baseline_token: Optional[int]
    speculative_token: Optional[int]
    context: str  # decoded text just before the divergence (when a tokenizer is available)
    margin: Optional[float]  # baseline top-2 logit margin at that position (None: engine returns no logits)
    kind: str  # near-tie | mismatch


@dataclass
class PromptResult:
    prompt: str
    identical: bool
    baseline_tokens: int
    speculative_tokens: int
    text_identical: bool
    divergence: Optional[Divergence] = None
    acceptance_rate: Optional[float] = None


@dataclass
class CheckReport:
    protocol: str
    num_draft_tokens: Optional[int]
    results: list[PromptResult] = field(default_factory=list)
    distribution: list[dict] = field(default_factory=list)

    @property
    def match_rate(self) -> float:
        return sum(r.identical for r in self.results) / len(self.results) if self.results else 1.0

    @property
    def real_mismatches(self) -> int:
        return sum(1 for r in self.results if r.divergence is not None and r.divergence.kind == "mismatch")

    @property
    def near_ties(self) -> int:
        return sum(1 for r in self.results if r.divergence is not None and r.divergence.kind == "near-tie")

    @property
    def distribution_failures(self) -> int:
        return sum(1 for d in self.distribution if not d["passed"])

    @property
    def passed(self) -> bool:
        return self.real_mismatches == 0 and self.distribution_failures == 0

    def to_dict(self) -> dict:
        return {"protocol": self.protocol, "num_draft_tokens": self.num_draft_tokens, "match_rate": self.match_rate,
                "real_mismatches": self.real_mismatches, "near_ties": self.near_ties, "passed": self.passed,
                "results": [asdict(r) for r in self.results], "distribution": self.distribution}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_margin(client: LLMClient, prompt_ids: Sequence[int], prefix: Sequence[int]) -> Optional[float]:
    """The engine's logit margin between its two best next tokens after prompt + prefix (None if unavailable)."""
    try:
        logits = client.engine_logits(TARGET, list(prompt_ids) + list(prefix))
    except ClientError:
        return None
    if logits is None or logits.size == 0:
        return None
    top = np.sort(logits.reshape(-1))[-2:]
    return float(top[1] - top[0])


def check_greedy(client: LLMClient, prompts: Sequence[Prompt], *, num_draft_tokens: Optional[int] = None,
                 tokenizer=None, near_tie_margin: float = NEAR_TIE_MARGIN,
                 progress: Optional[Callable[[int], None]] = None) -> CheckReport:
    rep = CheckReport(client.protocol, num_draft_tokens)
    params = dict(GREEDY)
    spec_params = dict(params, return_perf_metrics=True)
    if num_draft_tokens is not None:
        spec_params[NUM_DRAFT_TOKENS] = num_draft_tokens
    for i, p in enumerate(prompts):
        base = client.generate(BASELINE, p.text, p.max_tokens, **params)
        spec = client.generate(SPECULATIVE, p.text, p.max_tokens, **spec_params)
        idx = first_divergence(base.output_ids, spec.output_ids)
        res = PromptResult(p.text[:80], idx is None, len(base.output_ids), len(spec.output_ids),
                           base.text == spec.text, acceptance_rate=spec.metrics.get("acceptance_rate"))
        if idx is not None:
            bt = base.output_ids[idx] if idx < len(base.output_ids) else None
            st = spec.output_ids[idx] if idx < len(spec.output_ids) else None
            ctx = ""
            margin = None
            if tokenizer is not None:
                ctx = tokenizer.decode(base.output_ids[max(0, idx - 12):idx])
                margin = top2_margin(client, tokenizer.encode(p.text), base.output_ids[:idx])
            kind = "near-tie" if margin is not None and margin < near_tie_margin else "mismatch"
            res.divergence = Divergence(idx, bt, st, ctx, margin, kind)
        rep.results.append(res)
        if progress:
            progress(i + 1)
    return rep


# -- sampling: distribution-level check ---------------------------------------------------------------------


def chi2_sf(x: float, dof: int) -> float:
    """Survival function of the chi-square distribution (regularized upper incomplete gamma Q(dof/2, x/2))."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(500):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction for Q (Lentz)
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def chi2_homogeneity(a: Sequence, b: Sequence, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Two-sample chi-square test on categorical outcomes; rare categories pooled. -> (statistic, dof, p)."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cats = sorted(set(ca) | set(cb), key=lambda c: -(ca[c] + cb[c]))
    rows, other_a, other_b = [], 0, 0
    for c in cats:
        tot = ca[c] + cb[c]
        if tot * min(na, nb) / (na + nb) >= min_expected:
            rows.append((ca[c], cb[c]))
        else:
            other_a, other_b = other_a + ca[c], other_b + cb[c]
    if other_a + other_b:
        rows.append((other_a, other_b))
    if len(rows) < 2:
        return 0.0, 0, 1.0
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    dof = len(rows) - 1
    return stat, dof, chi2_sf(stat, dof)


def check_sampling(client: LLMClient, prompts: Sequence[Prompt], rep: CheckReport, *, temperature: float,
                   top_p: float = 1.0, samples: int = SAMPLING_SAMPLES, dist_tokens: int = 1, alpha: float = 0.001,
                   num_draft_tokens: Optional[int] = None, progress: Optional[Callable[[int], None]] = None) -> None:
    extra = {} if num_draft_tokens is None else {NUM_DRAFT_TOKENS: num_draft_tokens}
    for i, p in enumerate(prompts):
        outs = {BASELINE: [], SPECULATIVE: []}
        for s in range(samples):
            for model in (BASELINE, SPECULATIVE):
                g = client.generate(model, p.text, dist_tokens, exclude_input_in_output=True, temperature=temperature,
                                    top_p=top_p, seed=1_000 + s, **(extra if model == SPECULATIVE else {}))
                outs[model].append(tuple(g.output_ids[:dist_tokens]))
        stat, dof, pval = chi2_homogeneity(outs[BASELINE], outs[SPECULATIVE])
        # dof 0: every sample of both models fell in one category (the distribution is near-deterministic at this
        # temperature): the test has nothing to compare — inconclusive, not a pass
        rep.distribution.append({"prompt": p.text[:80], "samples": samples, "tokens": dist_tokens,
                                 "temperature": temperature, "chi2": stat, "dof": dof, "p_value": pval,
                                 "passed": pval >= alpha, "inconclusive": dof == 0})
        if progress:
            progress(i + 1)


def format_check(rep: CheckReport) -> str:
    lines = [f"identity check over {rep.protocol}: {sum(r.identical for r in rep.results)}/{len(rep.results)} prompts "
             f"token-identical ({rep.match_rate:.0%})"]
    for r in rep.results:
        if r.divergence is not None:
            d = r.divergence
            m = "n/a (engine returns no logits)" if d.margin is None else f"{d.margin:.4f}"
            lines.append(f"  DIVERGED at token {d.index}: baseline {d.baseline_token} vs speculative "
                         f"{d.speculative_token} after {d.context!r}; top-2 margin {m} -> {d.kind}   [{r.prompt!r}]")
    for d in rep.distribution:
        if d.get("inconclusive"):
            verdict = ("INCONCLUSIVE: every sample of both models was the same token(s), so there is no distribution "
                       "to compare; raise --temperature or --samples")
        else:
            verdict = "ok" if d["passed"] else "DIFFERENT DISTRIBUTIONS"
        lines.append(f"  sampling T={d['temperature']}: chi2={d['chi2']:.2f} dof={d['dof']} p={d['p_value']:.4f} "
                     f"over {d['samples']} samples -> {verdict}")
    verdict = "PASS" if rep.passed else "FAIL"
    lines.append(f"verdict: {verdict} ({rep.real_mismatches} real mismatch(es), {rep.near_ties} near-tie(s), "
                 f"{rep.distribution_failures} distribution failure(s))")
    return "\n".join(lines)
