"""`trt-spec check`: is the speculative model's output the target's own output?

Greedy: token ids of baseline and speculative are compared; at the first divergence the baseline engine is probed
teacher-forced for its next-token logits, and if both tokens lie within the margin of the best it is a numerical
near-tie (GPU context-phase numerics may swap them) and passes, else a mismatch. The margin is measured: the noise
floor is the largest |top-2 gap| difference between the baseline engine's generation-phase logits and a teacher-forced
context-phase probe of the same position, times NOISE_FLOOR_SAFETY. runtime llmapi returns no logits, so its
divergences are unverified (neither pass nor mismatch; exit 3). Sampling: a chi-square homogeneity test over seeded
samples of the first tokens; p < alpha fails.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from ..records.defaults import (
    ADD_SPECIAL_TOKENS,
    CONTINUATION_TOKENS,
    NEAR_TIE_MARGIN,
    NEAR_TIE_MARGIN_EXACT,
    NOISE_FLOOR_POSITIONS,
    NOISE_FLOOR_SAFETY,
    NOISE_FLOOR_TOKENS,
    SAMPLING_SAMPLES,
)
from ..records.names import BASELINE, NUM_DRAFT_TOKENS, SPECULATIVE
from .client import GREEDY, ClientError, LLMClient
from .phases import PHASED_NOTE, Measurement, is_phased, measure
from .prompts import Prompt

EXIT_FAIL, EXIT_UNVERIFIED = 1, 3  # 2 is a user's mistake (cli.USER_ERROR)
# upstream-facts: llmapi-no-logprobs
LLMAPI_NO_LOGITS = (
    "no probe: TensorRT-LLM's LLM-API model returns text only (no logits or log-probabilities), so a numerical "
    "near-tie cannot be told from a defect; check this deployment's engine-runtime twin, or compare the texts"
)


@dataclass
class Divergence:
    index: int
    baseline_token: Optional[int]
    speculative_token: Optional[int]
    context: str  # decoded text before the divergence
    margin: Optional[float]  # probe's top-2 logit margin (None: no logits)
    kind: str  # near-tie | mismatch | unverified
    gap: Optional[float] = None  # how far the farther token trails the best logit
    probe: str = ""  # engine probed, or why no logits
    baseline_text: str = ""  # each side's continuation from the divergence on
    speculative_text: str = ""


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
    near_tie_margin: float = NEAR_TIE_MARGIN  # the margin used
    order: Optional[str] = None  # phases.PHASED_NOTE when phased
    margin_source: str = ""  # where near_tie_margin came from
    noise_floor: Optional[dict] = None  # measure_noise_floor's answer; None: not attempted

    @property
    def measured_margin(self) -> Optional[float]:
        """NOISE_FLOOR_SAFETY x the measured noise floor; None when nothing was measured."""
        nf = self.noise_floor or {}
        return None if nf.get("max") is None else NOISE_FLOOR_SAFETY * nf["max"]

    @property
    def match_rate(self) -> float:
        return sum(r.identical for r in self.results) / len(self.results) if self.results else 1.0

    def _count(self, kind: str) -> int:
        return sum(1 for r in self.results if r.divergence is not None and r.divergence.kind == kind)

    @property
    def real_mismatches(self) -> int:
        return self._count("mismatch")

    @property
    def near_ties(self) -> int:
        return self._count("near-tie")

    @property
    def unverified(self) -> int:
        return self._count("unverified")

    @property
    def probed_gaps(self) -> list[float]:
        return [r.divergence.gap for r in self.results if r.divergence is not None and r.divergence.gap is not None]

    @property
    def distribution_failures(self) -> int:
        return sum(1 for d in self.distribution if not d["passed"])

    @property
    def failed(self) -> bool:
        return self.real_mismatches > 0 or self.distribution_failures > 0

    @property
    def passed(self) -> bool:
        """Nothing failed and nothing was left unverified."""
        return not self.failed and self.unverified == 0

    @property
    def verdict(self) -> str:
        return "FAIL" if self.failed else "UNVERIFIED" if self.unverified else "PASS"

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.failed else EXIT_UNVERIFIED if self.unverified else 0

    def to_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "num_draft_tokens": self.num_draft_tokens,
            "match_rate": self.match_rate,
            "real_mismatches": self.real_mismatches,
            "near_ties": self.near_ties,
            "unverified": self.unverified,
            "near_tie_margin": self.near_tie_margin,
            "margin_source": self.margin_source,
            "measured_margin": self.measured_margin,
            "noise_floor": self.noise_floor,
            "probed_gaps": gap_summary(self.probed_gaps),
            "verdict": self.verdict,
            "passed": self.passed,
            "results": [asdict(r) for r in self.results],
            "distribution": self.distribution,
            **({"order": self.order} if self.order else {}),
        }


def gap_summary(xs: Sequence[float]) -> dict:
    """count, min, median, max of xs (None without values)."""
    xs = sorted(xs)
    if not xs:
        return {"count": 0, "min": None, "median": None, "max": None}
    mid = len(xs) // 2
    median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return {"count": len(xs), "min": xs[0], "median": median, "max": xs[-1]}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def probe_gap(logits: np.ndarray, tokens: Sequence[Optional[int]]) -> tuple[float, Optional[float]]:
    """(top-2 margin, gap) from logits [V]: gap is how far the farther of tokens trails the best (None: one unknown)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    top = np.sort(x)[-2:]
    margin = float(top[1] - top[0])
    if any(t is None or not 0 <= t < x.size for t in tokens):
        return margin, None
    return margin, float(top[1] - min(x[t] for t in tokens))


def kind_of(gap: Optional[float], near_tie_margin: float) -> str:
    return "near-tie" if gap is not None and gap < near_tie_margin else "mismatch"


def classify(
    logits: np.ndarray, tokens: Sequence[Optional[int]], near_tie_margin: float = NEAR_TIE_MARGIN
) -> tuple[str, float, Optional[float]]:
    """(kind, top-2 margin, gap) from logits [V]: "near-tie" if both tokens are within near_tie_margin of the best."""
    margin, gap = probe_gap(logits, tokens)
    return kind_of(gap, near_tie_margin), margin, gap


def top2_gap(logits: np.ndarray) -> float:
    top = np.sort(np.asarray(logits, dtype=np.float64).reshape(-1))[-2:]
    return float(top[1] - top[0])


def measure_noise_floor(
    client: LLMClient, model: str, prompt_ids: Sequence[Sequence[int]], limit: int = NOISE_FLOOR_POSITIONS
) -> dict:
    """The baseline engine's own numerics noise: at up to `limit` positions of its greedy output, |top-2 gap of the
    generation-phase logits - top-2 gap of a teacher-forced context-phase probe of the same position|.

    {"positions", "max", "median", "engine"}; "max" None and "why" when nothing could be measured."""
    diffs: list[float] = []

    def unmeasured(why: str) -> dict:
        return {"positions": len(diffs), "max": None, "median": None, "engine": model, "why": why}

    try:
        for ids in prompt_ids:
            if len(diffs) >= limit:
                break
            tokens, gen = client.engine_generation(model, list(ids), NOISE_FLOOR_TOKENS)
            if gen is None:
                return unmeasured(f"{model} returned no generation_logits")
            for j in range(1, min(len(tokens), gen.shape[0], limit - len(diffs) + 1)):  # row 0: the context phase
                ctx = client.engine_logits(model, list(ids) + tokens[:j])
                if ctx is None:
                    return unmeasured(f"{model} returned no generation_logits")
                diffs.append(abs(top2_gap(gen[j]) - top2_gap(ctx)))
    except ClientError as e:
        return unmeasured(str(e))
    if not diffs:
        return unmeasured("no generated positions")
    s = gap_summary(diffs)
    return {"positions": s["count"], "max": s["max"], "median": s["median"], "engine": model}


def probe_logits(client: LLMClient, model: str, input_ids: Sequence[int]) -> tuple[Optional[np.ndarray], str]:
    """(the engine's next-token logits after input_ids, probe) or (None, why not)."""
    try:
        logits = client.engine_logits(model, list(input_ids))
    except ClientError as e:
        return None, f"{model}: {e}"
    if logits is None or logits.size == 0:
        return None, f"{model} returned no generation_logits"
    return logits, model


def default_near_tie_margin(client: LLMClient, engine: str) -> float:
    """NEAR_TIE_MARGIN, or NEAR_TIE_MARGIN_EXACT for the exact CPU stand-in (platform "python")."""
    try:
        platform = client.model_metadata(engine).get("platform", "")
    except Exception:  # noqa: BLE001 - unreadable: the GPU's allowance
        platform = ""
    return NEAR_TIE_MARGIN_EXACT if platform == "python" else NEAR_TIE_MARGIN


def check_greedy(
    client: LLMClient,
    prompts: Sequence[Prompt],
    *,
    num_draft_tokens: Optional[int] = None,
    tokenizer=None,
    near_tie_margin: Optional[float] = None,
    margin_source: str = "--margin",
    progress: Optional[Callable[[int], None]] = None,
) -> CheckReport:
    """Greedy identity over `prompts`; without a tokenizer every divergence is a mismatch."""
    m = greedy_measurement(
        client,
        prompts,
        num_draft_tokens=num_draft_tokens,
        tokenizer=tokenizer,
        near_tie_margin=near_tie_margin,
        margin_source=margin_source,
    )
    return measure(client, [m], stage=lambda label, total: (contextlib.nullcontext(), progress))[0]


def greedy_measurement(
    client: LLMClient,
    prompts: Sequence[Prompt],
    *,
    num_draft_tokens: Optional[int] = None,
    tokenizer=None,
    near_tie_margin: Optional[float] = None,
    margin_source: str = "--margin",
) -> Measurement:
    """check_greedy as a phases.Measurement."""
    kw = dict(
        num_draft_tokens=num_draft_tokens,
        tokenizer=tokenizer,
        near_tie_margin=near_tie_margin,
        margin_source=margin_source,
    )
    params = dict(GREEDY)
    spec_params = dict(
        params, return_perf_metrics=True, **({} if num_draft_tokens is None else {NUM_DRAFT_TOKENS: num_draft_tokens})
    )

    def side(model: str, params: dict) -> Callable:
        def run(progress) -> list:
            out = []
            for p in prompts:
                out.append(client.generate(model, p.text, p.max_tokens, **params))
                if progress:
                    progress(len(out))
            return out

        return run

    return Measurement(
        f"identity ({client.protocol})",
        len(prompts),
        lambda progress: compare_greedy(client, prompts, None, progress=progress, **kw),
        side(SPECULATIVE, spec_params),
        side(BASELINE, params),
        lambda s_all, b_all: compare_greedy(client, prompts, list(zip(b_all, s_all)), **kw),
        len(prompts),
    )


def compare_greedy(
    client: LLMClient,
    prompts: Sequence[Prompt],
    pairs: Optional[list],
    *,
    num_draft_tokens: Optional[int] = None,
    tokenizer=None,
    near_tie_margin: Optional[float] = None,
    margin_source: str = "--margin",
    progress: Optional[Callable[[int], None]] = None,
) -> CheckReport:
    """Compare (baseline, speculative) pairs per prompt; pairs None generates them here. Divergences are classified
    once the margin is known: near_tie_margin if given, else the measured one, else the fallback."""
    rep = CheckReport(client.protocol, num_draft_tokens)
    probe_model: Optional[str] = None  # resolved at the first divergence, or for the noise floor
    probed: list[Divergence] = []  # with a gap, classified at the end
    params = dict(GREEDY)
    spec_params = dict(params, return_perf_metrics=True)
    if num_draft_tokens is not None:
        spec_params[NUM_DRAFT_TOKENS] = num_draft_tokens
    if pairs is not None:
        rep.order = PHASED_NOTE

    def encode(p: Prompt) -> list[int]:
        return list(tokenizer.encode(p.text, add_special_tokens=ADD_SPECIAL_TOKENS))

    for i, p in enumerate(prompts):
        if pairs is not None:
            base, spec = pairs[i]
        else:
            base = client.generate(BASELINE, p.text, p.max_tokens, **params)
            spec = client.generate(SPECULATIVE, p.text, p.max_tokens, **spec_params)
        idx = first_divergence(base.output_ids, spec.output_ids)
        res = PromptResult(
            p.text[:80],
            idx is None,
            len(base.output_ids),
            len(spec.output_ids),
            base.text == spec.text,
            acceptance_rate=spec.metrics.get("acceptance_rate"),
        )
        if idx is not None:
            bt = base.output_ids[idx] if idx < len(base.output_ids) else None
            st = spec.output_ids[idx] if idx < len(spec.output_ids) else None
            d = Divergence(idx, bt, st, "", None, "mismatch", None, "")
            d.baseline_text, d.speculative_text = continuations(base, spec, idx, tokenizer)
            d.probe = "no tokenizer (pass --tokenizer to read the baseline engine's logits)"
            if tokenizer is not None:
                d.context = tokenizer.decode(base.output_ids[max(0, idx - 12) : idx])
                if probe_model is None:
                    probe_model = client.baseline_engine() or ""
                if not probe_model:  # runtime llmapi
                    d.kind, d.probe = "unverified", LLMAPI_NO_LOGITS
                else:
                    logits, d.probe = probe_logits(client, probe_model, encode(p) + list(base.output_ids[:idx]))
                    if logits is not None:  # a missing token on the shorter side was EOS
                        eos = getattr(tokenizer, "eos_token_id", None)
                        d.margin, d.gap = probe_gap(logits, [eos if t is None else t for t in (bt, st)])
                        probed.append(d)
            res.divergence = d
        rep.results.append(res)
        if progress:
            progress(i + 1)
    if tokenizer is not None and probe_model is None:
        probe_model = client.baseline_engine() or ""
    if tokenizer is not None and probe_model:
        rep.noise_floor = measure_noise_floor(client, probe_model, [encode(p) for p in prompts])
    rep.near_tie_margin, rep.margin_source = choose_margin(rep, client, probe_model, near_tie_margin, margin_source)
    for d in probed:
        d.kind = kind_of(d.gap, rep.near_tie_margin)
    return rep


def choose_margin(
    rep: CheckReport, client: LLMClient, probe_model: Optional[str], given: Optional[float], given_source: str
) -> tuple[float, str]:
    """(margin, where it came from): the given one, else the measured one, else the stated fallback."""
    if given is not None:
        return given, given_source
    if rep.measured_margin is not None:
        return rep.measured_margin, f"measured: {NOISE_FLOOR_SAFETY:g} x the noise floor"
    if probe_model:
        why = (rep.noise_floor or {}).get("why", "")
        fallback = default_near_tie_margin(client, probe_model)
        return fallback, "fallback: no noise floor measured" + (f" ({why})" if why else "")
    return rep.near_tie_margin, "none needed: no engine to probe"


def continuations(base, spec, idx: int, tokenizer) -> tuple[str, str]:
    """Each side's text from the divergence on, CONTINUATION_TOKENS long (without a tokenizer: from the first
    differing character)."""
    if tokenizer is not None:
        end = idx + CONTINUATION_TOKENS
        return tokenizer.decode(base.output_ids[idx:end]), tokenizer.decode(spec.output_ids[idx:end])
    a, b = base.text or "", spec.text or ""
    k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[k : k + 8 * CONTINUATION_TOKENS], b[k : k + 8 * CONTINUATION_TOKENS]


def chi2_sf(x: float, dof: int) -> float:
    """Chi-square survival function, Q(dof/2, x/2)."""
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
    """(statistic, dof, p) of a two-sample chi-square test; rare categories pooled."""
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


def check_sampling(
    client: LLMClient,
    prompts: Sequence[Prompt],
    rep: CheckReport,
    *,
    temperature: float,
    top_p: float = 1.0,
    samples: int = SAMPLING_SAMPLES,
    dist_tokens: int = 1,
    alpha: float = 0.001,
    num_draft_tokens: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> None:
    """Append the distribution check over `prompts` to rep.distribution."""
    m = sampling_measurement(
        client,
        prompts,
        temperature=temperature,
        top_p=top_p,
        samples=samples,
        dist_tokens=dist_tokens,
        alpha=alpha,
        num_draft_tokens=num_draft_tokens,
    )
    rep.distribution.extend(measure(client, [m], stage=lambda label, total: (contextlib.nullcontext(), progress))[0])
    if is_phased(client):
        rep.order = PHASED_NOTE


def sampling_measurement(
    client: LLMClient,
    prompts: Sequence[Prompt],
    *,
    temperature: float,
    top_p: float = 1.0,
    samples: int = SAMPLING_SAMPLES,
    dist_tokens: int = 1,
    alpha: float = 0.001,
    num_draft_tokens: Optional[int] = None,
) -> Measurement:
    """check_sampling as a phases.Measurement yielding CheckReport.distribution rows."""
    extra = {} if num_draft_tokens is None else {NUM_DRAFT_TOKENS: num_draft_tokens}

    def one(model: str, p: Prompt, s: int) -> tuple:
        g = client.generate(
            model,
            p.text,
            dist_tokens,
            exclude_input_in_output=True,
            temperature=temperature,
            top_p=top_p,
            seed=1_000 + s,
            **(extra if model == SPECULATIVE else {}),
        )
        return tuple(g.output_ids[:dist_tokens])

    def row(p: Prompt, base: list, spec: list) -> dict:
        stat, dof, pval = chi2_homogeneity(base, spec)
        # dof 0: all samples in one category, so the test is inconclusive, not a pass
        return {
            "prompt": p.text[:80],
            "samples": samples,
            "tokens": dist_tokens,
            "temperature": temperature,
            "chi2": stat,
            "dof": dof,
            "p_value": pval,
            "passed": pval >= alpha,
            "inconclusive": dof == 0,
        }

    def side(model: str) -> Callable:
        def run(progress) -> list:
            out = []
            for p in prompts:
                out.append([one(model, p, s) for s in range(samples)])
                if progress:
                    progress(len(out))
            return out

        return run

    def interleaved(progress) -> list[dict]:
        rows = []
        for i, p in enumerate(prompts):
            outs: dict = {BASELINE: [], SPECULATIVE: []}
            for s in range(samples):
                for model in (BASELINE, SPECULATIVE):
                    outs[model].append(one(model, p, s))
            rows.append(row(p, outs[BASELINE], outs[SPECULATIVE]))
            if progress:
                progress(i + 1)
        return rows

    return Measurement(
        f"sampling T={temperature}",
        len(prompts),
        interleaved,
        side(SPECULATIVE),
        side(BASELINE),
        lambda s_all, b_all: [row(p, b, s) for p, b, s in zip(prompts, b_all, s_all)],
        len(prompts),
    )


def describe(d: Divergence) -> str:
    """One divergence in a line."""
    head = f"at token {d.index}: baseline {d.baseline_token} vs speculative {d.speculative_token} after {d.context!r}"
    if d.kind == "unverified":
        return f"{head}; baseline goes on {d.baseline_text!r}, speculative {d.speculative_text!r} ({d.probe})"
    if d.margin is None:
        return f"{head}; no logits to classify it ({d.probe})"
    trail = "n/a (a token unknown)" if d.gap is None else f"{d.gap:.4f}"
    return f"{head}; top-2 margin {d.margin:.4f}, farther token {trail} below the best ({d.probe})"


def _num(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def format_check(rep: CheckReport) -> str:
    lines = [
        f"identity check over {rep.protocol}: {sum(r.identical for r in rep.results)}/{len(rep.results)} prompts "
        f"token-identical ({rep.match_rate:.0%})"
    ] + ([f"  order: {rep.order}"] if rep.order else [])
    nf = rep.noise_floor
    if nf is not None:
        if nf.get("max") is None:
            lines.append(f"  noise floor: not measured ({nf.get('why', '')})")
        else:
            lines.append(
                f"  noise floor: max {_num(nf['max'])}, median {_num(nf['median'])} logits over {nf['positions']} "
                f"position(s) (|top-2 gap| of {nf['engine']}'s generation-phase logits vs a teacher-forced "
                f"context-phase probe); measured margin {_num(rep.measured_margin)}"
            )
    if nf is not None or rep.probed_gaps:
        lines.append(f"  margin: {rep.near_tie_margin:.4g} logits ({rep.margin_source})")
    g = gap_summary(rep.probed_gaps)
    if g["count"]:
        lines.append(
            f"  probed gaps at {g['count']} divergence(s): min {_num(g['min'])}, median {_num(g['median'])}, "
            f"max {_num(g['max'])} logits"
        )
    for kind, title in (
        (
            "near-tie",
            f"near-ties (pass: both tokens within {rep.near_tie_margin:.4g} logits of the "
            "baseline engine's best; GPU numerics may swap them)",
        ),
        ("unverified", "unverified (no logits to tell a near-tie from a defect; neither pass nor fail)"),
        ("mismatch", "real mismatches (fail)"),
    ):
        found = [r for r in rep.results if r.divergence is not None and r.divergence.kind == kind]
        if found:
            lines.append(f"  {title}:")
        for r in found:
            lines.append(f"    {kind.upper()}: DIVERGED {describe(r.divergence)}   [{r.prompt!r}]")
    for d in rep.distribution:
        if d.get("inconclusive"):
            verdict = (
                "INCONCLUSIVE: every sample of both models was the same token(s), so there is no distribution "
                "to compare; raise --temperature or --samples"
            )
        else:
            verdict = "ok" if d["passed"] else "DIFFERENT DISTRIBUTIONS"
        lines.append(
            f"  sampling T={d['temperature']}: chi2={d['chi2']:.2f} dof={d['dof']} p={d['p_value']:.4f} "
            f"over {d['samples']} samples -> {verdict}"
        )
    lines.append(
        f"verdict: {rep.verdict} ({rep.real_mismatches} real mismatch(es), {rep.near_ties} near-tie(s), "
        f"{rep.unverified} unverified, {rep.distribution_failures} distribution failure(s))"
    )
    return "\n".join(lines)
