"""`trt-spec bench` / `trt-spec tune` against a served deployment: paired A/B, concurrency sweep and request rate.

Baseline and speculative requests alternate per prompt (both streamed, greedy, each primed so neither reuses the
other's prefill); the speedup and acceptance come from records.speculation. Each run is a phases.Measurement, so a
baseline loaded for its phase only runs as two halves with one model switch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import random
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..records import llmapi_contract as lc
from ..records.names import (
    ACCEPTED_LENGTH_HISTOGRAM,
    BASELINE,
    CACHE_ACCEPTED_TOKENS,
    DRAFT_LEN_POLICY,
    DRAFT_LENGTHS,
    NUM_DRAFT_TOKENS,
    PROFILE,
    RETURN_PROFILE,
    SPECULATIVE,
    TOTAL_STEPS,
)
from ..records.profile import RequestProfile
from ..records.profile import summarize as profile_table
from ..records.speculation import AcceptanceCounts, Policy, acceptance_summary, paired_speedup, solve_alpha
from .client import GREEDY, ClientError, Generation, LLMClient
from .metrics import Summary, low_acceptance_advice, total_throughput, tpot
from .phases import PHASED_NOTE, Measurement, is_phased, measure
from .prompts import UNCATEGORISED, Prompt, conversation

Progress = Optional[Callable[[int, int], None]]


@dataclass
class RequestSample:
    """One measured request of a bench run."""

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
    draft_lengths: Optional[list[int]] = None  # k per round (0 = no speculation)
    acceptance_source: Optional[str] = None
    acceptance_note: Optional[str] = None  # lc.ACCEPTANCE_NOTE
    category: str = ""
    turn: int = 1
    answer_digest: Optional[str] = None  # --turns all: compares the two sides' answers
    cache_accepted: Optional[int] = None  # accepted tokens the cross-request cache backed (None: not reported)
    tenant: Optional[str] = None  # the tenant a speculative request was sent as
    profile: Optional[dict] = None  # --profile: the BLS's records/profile.RequestProfile of this request

    @staticmethod
    def of(
        model: str,
        i: int,
        r: int,
        g: Generation,
        category: str = "",
        turn: int = 1,
        answer: Optional[str] = None,
        tenant: Optional[str] = None,
    ) -> "RequestSample":
        m = g.metrics
        cache = m.get(CACHE_ACCEPTED_TOKENS)
        profile = m.get(PROFILE)
        return RequestSample(
            model,
            i,
            r,
            g.num_tokens,
            g.ttft_s,
            g.latency_s,
            tpot(g.latency_s, g.ttft_s, g.num_tokens),
            int(m.get("total_accepted_draft_tokens", 0)),
            int(m.get("total_draft_tokens", 0)),
            int(m.get(TOTAL_STEPS, 0)),
            m.get(ACCEPTED_LENGTH_HISTOGRAM),
            m.get(DRAFT_LENGTHS),
            m.get(lc.ACCEPTANCE_SOURCE),
            m.get(lc.ACCEPTANCE_NOTE),
            category,
            turn,
            None if answer is None else hashlib.sha1(answer.encode()).hexdigest()[:16],
            None if cache is None else int(cache),
            tenant if model == SPECULATIVE else None,
            None if profile is None else RequestProfile.parse(profile),
        )


@contextlib.contextmanager
def as_tenant(client, tenant: Optional[str]):
    """Send the block's speculative requests as `tenant` (None: as none)."""
    before = getattr(client, "tenant", None)
    client.tenant = tenant
    try:
        yield
    finally:
        client.tenant = before


def conversation_tenant(base: Optional[str], run: str, i: int, r: int) -> str:
    """The one tenant of prompt i's conversation, repeat r, in one run: the cross-request cache then holds that
    conversation's earlier turns only (no other conversation's, no earlier run's or repeat's)."""
    return f"{base or 'trt-spec-bench'}/{run}/{i}/{r}"


@dataclass(frozen=True)
class Chat:
    """--turns all: render(messages) is what a request sends; answer(generation) is fed back as the assistant turn."""

    render: Callable[[list[dict]], object]
    answer: Callable[[Generation], str] = lambda g: g.text


def _request(
    client: LLMClient, model: str, p: Prompt, k: Optional[int], policy: Optional[str] = None, prompt: object = None
) -> Generation:
    extra = {}
    if model == SPECULATIVE:
        extra = {name: v for name, v in ((NUM_DRAFT_TOKENS, k), (DRAFT_LEN_POLICY, policy)) if v is not None}
        if getattr(client, "profile", False):  # bench --profile: the BLS adds where the request's time went
            extra[RETURN_PROFILE] = True
    return client.generate(model, p.text if prompt is None else prompt, p.max_tokens, stream=True, **GREEDY, **extra)


def _prime(client: LLMClient, p: Prompt, k, policy, prompts: Optional[dict[str, object]] = None) -> None:
    """Prefill the prompt once on each model (a one-token request) before a pair.

    Where both share the target engine, its prefix cache would otherwise give the second side the first's prefill."""
    one = dataclasses.replace(p, max_tokens=1)
    for model in (BASELINE, SPECULATIVE):
        try:
            _request(client, model, one, k, policy, None if prompts is None else prompts[model])
        except ClientError:  # the measured request will fail with its own message
            return


def _turn(
    client, model: str, p: Prompt, answers: list[str], chat: Chat, k, policy, tenant: Optional[str] = None
) -> Generation:
    """The next turn of p's conversation on one model (as `tenant`); an error past turn 1 names the question and
    turn."""
    t = len(answers) + 1
    try:
        with as_tenant(client, tenant if tenant is not None else getattr(client, "tenant", None)):
            return _request(client, model, p, k, policy, chat.render(conversation(p.turns, answers)))
    except ClientError as e:
        if t == 1:
            raise
        raise ClientError(
            f"question {p.id or '?'} turn {t} ({model}): {e}; a conversation grows by each answer: lower "
            "--max-tokens, or --turns first"
        ) from None


def conversation_samples(
    client, model: str, i: int, r: int, p: Prompt, chat: Chat, k, policy, tenant: Optional[str] = None
) -> list[RequestSample]:
    """One sample per turn of prompt i's conversation on one model, fed its own answers, every turn as `tenant`."""
    answers: list[str] = []
    out = []
    for t in range(1, len(p.turns) + 1):
        g = _turn(client, model, p, answers, chat, k, policy, tenant)
        answers.append(chat.answer(g))
        out.append(RequestSample.of(model, i, r, g, p.category, t, answers[-1], tenant))
    return out


def request_acceptance_counts(spec: Sequence[RequestSample]) -> AcceptanceCounts:
    """The speculative requests' acceptance totals for records.speculation.acceptance_summary."""
    steps = sum(s.steps for s in spec)
    hists = [s.histogram for s in spec if s.histogram]
    width = max((len(h) for h in hists), default=0)
    hist = [sum(h[i] for h in hists if i < len(h)) for i in range(width)]
    ks = [x for s in spec if s.draft_lengths for x in s.draft_lengths]
    counts = [ks.count(i) for i in range(max(ks, default=-1) + 1)]
    sources = [s.acceptance_source for s in spec if s.acceptance_source]
    notes = [s.acceptance_note for s in spec if s.acceptance_note]
    return AcceptanceCounts(
        requests=len(spec),
        accepted=sum(s.accepted for s in spec),
        drafted=sum(s.drafted for s in spec),
        steps=steps,
        # without a histogram every step counts as a drafting round
        speculative_rounds=sum(hist) + sum(s.steps for s in spec if not s.histogram),
        rounds_without_speculation=counts[0] if counts else 0,
        histogram=tuple(hist),
        draft_length_counts=tuple(counts),
        source=max(set(sources), key=sources.count) if sources else None,
        notes=tuple(f"{n} ({notes.count(n)} of {len(spec)} requests)" for n in sorted(set(notes))),
    )


def ab_measurement(
    client: LLMClient,
    prompts: Sequence[Prompt],
    *,
    k: Optional[int] = None,
    repeats: int = 1,
    warmup: int = 1,
    policy: Optional[str] = None,
    chat: Optional[Chat] = None,
) -> Measurement:
    """The paired A/B: alternating per request, or in phases one model then the other (chat: one request per turn,
    each conversation under one tenant of its own)."""
    total = sum(len(p.turns) if chat else 1 for p in prompts) * repeats
    run = secrets.token_hex(4)  # this run's conversation tenants are new to the server
    base_tenant = getattr(client, "tenant", None)
    ids = [p.id for p in prompts]

    def tenant(i: int, r: int) -> str:
        return conversation_tenant(base_tenant, run, i, r)

    def warm(model: str, p: Prompt, pol: Optional[str]) -> None:
        _request(client, model, p, k, pol, None if chat is None else chat.render(conversation(p.turns, [])))

    def side(model: str) -> Callable[[Progress], list[RequestSample]]:
        def run(progress: Progress) -> list[RequestSample]:
            for p in prompts[:warmup]:
                warm(model, p, policy)
            out = []
            for r in range(repeats):
                for i, p in enumerate(prompts):
                    if chat is None:
                        out.append(RequestSample.of(model, i, r, _request(client, model, p, k, policy), p.category))
                    else:
                        out += conversation_samples(client, model, i, r, p, chat, k, policy, tenant(i, r))
                    if progress:
                        progress(len(out), total)
            return out

        return run

    def interleaved(progress: Progress) -> dict:
        for p in prompts[:warmup]:
            warm(BASELINE, p, None)
            warm(SPECULATIVE, p, policy)
        samples: list[RequestSample] = []
        for r in range(repeats):
            for i, p in enumerate(prompts):
                if chat is None:
                    _prime(client, p, k, policy)
                    order = (BASELINE, SPECULATIVE) if (i + r) % 2 == 0 else (SPECULATIVE, BASELINE)
                    for model in order:
                        g = _request(client, model, p, k, policy)
                        samples.append(RequestSample.of(model, i, r, g, p.category))
                else:
                    samples += _paired_conversation(client, i, r, p, chat, k, policy, tenant(i, r))
                if progress:
                    progress(len(samples) // 2, total)
        return summarize(samples, k, policy, ids)

    label = f"A/B k={k if k is not None else 'default'}" + (f" {policy}" if policy else "")
    return Measurement(
        label,
        total,
        interleaved,
        side(SPECULATIVE),
        side(BASELINE),
        lambda spec, base: {**summarize(spec + base, k, policy, ids), "order": PHASED_NOTE},
        total,
        baseline_key=("A/B", tuple(prompts), repeats, chat),
    )


def _paired_conversation(
    client, i: int, r: int, p: Prompt, chat: Chat, k, policy, tenant: Optional[str] = None
) -> list[RequestSample]:
    """Prompt i's conversation on both models turn by turn, each fed its own answers, the speculative side as
    `tenant`."""
    answers: dict[str, list[str]] = {BASELINE: [], SPECULATIVE: []}
    out = []
    for t in range(1, len(p.turns) + 1):
        with as_tenant(client, None):  # a primed prompt in the cache would back every match in the prompt itself
            _prime(client, p, k, policy, {m: chat.render(conversation(p.turns, a)) for m, a in answers.items()})
        for model in (BASELINE, SPECULATIVE) if (i + r + t - 1) % 2 == 0 else (SPECULATIVE, BASELINE):
            g = _turn(client, model, p, answers[model], chat, k, policy, tenant)
            answers[model].append(chat.answer(g))
            out.append(RequestSample.of(model, i, r, g, p.category, t, answers[model][-1], tenant))
    return out


def _one(client, m: Measurement, progress: Progress = None):
    """Run one measurement on its own."""
    return measure(client, [m], stage=lambda label, total: (contextlib.nullcontext(), progress))[0]


def paired_ab(
    client: LLMClient,
    prompts: Sequence[Prompt],
    *,
    k: Optional[int] = None,
    repeats: int = 1,
    warmup: int = 1,
    progress: Progress = None,
    policy: Optional[str] = None,
) -> dict:
    return _one(client, ab_measurement(client, prompts, k=k, repeats=repeats, warmup=warmup, policy=policy), progress)


def paired(samples: Sequence[RequestSample]) -> list[tuple[RequestSample, RequestSample]]:
    """(baseline, speculative) per (prompt, repeat, turn) both models ran."""
    base = {(s.prompt, s.repeat, s.turn): s for s in samples if s.model == BASELINE}
    return [
        (base[(s.prompt, s.repeat, s.turn)], s)
        for s in samples
        if s.model == SPECULATIVE and (s.prompt, s.repeat, s.turn) in base
    ]


def conversations(samples: Sequence[RequestSample], ids: Sequence[str] = ()) -> Optional[dict]:
    """--turns all: paired turns and those whose answers differ (identity failures), and the figures per turn index
    and per conversation; None without conversations."""
    pairs = [(b, s) for b, s in paired(samples) if s.answer_digest is not None]
    if not pairs:
        return None
    differ = [
        {"prompt": s.prompt, "repeat": s.repeat, "turn": s.turn, "category": s.category}
        for b, s in pairs
        if b.answer_digest != s.answer_digest
    ]
    return {
        "turns": len(pairs),
        "identical": len(pairs) - len(differ),
        "differ": differ,
        "note": "each model is fed its own answers: after a turn whose answers differ, the two conversations differ",
        **turn_figures(pairs),
        "per_turn": [
            {"turn": t, **turn_figures([(b, s) for b, s in pairs if s.turn == t])}
            for t in sorted({s.turn for _, s in pairs})
        ],
        "per_conversation": [
            {
                "prompt": i,
                "id": ids[i] if i < len(ids) and ids[i] else str(i),
                "category": next(s.category for _, s in pairs if s.prompt == i),
                **turn_figures([(b, s) for b, s in pairs if s.prompt == i]),
            }
            for i in sorted({s.prompt for _, s in pairs})
        ],
    }


def turn_figures(pairs: Sequence[tuple[RequestSample, RequestSample]]) -> dict:
    """Paired turns' tok/s, speedup, speculative tokens per target call and the share of its tokens that were accepted
    from proposals the cross-request cache backed (None where the server does not report the count)."""
    base, spec = [b for b, _ in pairs], [s for _, s in pairs]
    speedup, lo, hi = paired_speedup([b.latency_s for b in base], [s.latency_s for s in spec])
    tokens = sum(s.tokens for s in spec)
    known = [b.answer_digest for b in base] + [s.answer_digest for s in spec]
    return {
        "requests": len(pairs),
        "baseline_tokens_per_s": _rate(sum(b.tokens for b in base), sum(b.latency_s for b in base)),
        "speculative_tokens_per_s": _rate(tokens, sum(s.latency_s for s in spec)),
        "speedup": speedup,
        "speedup_ci95": [lo, hi],
        "tokens_per_target_call": _rate(tokens, sum(s.steps for s in spec)) if all(s.steps for s in spec) else None,
        "cache_share": (
            _rate(sum(s.cache_accepted for s in spec), tokens)
            if all(s.cache_accepted is not None for s in spec)
            else None
        ),
        "identical": sum(b.answer_digest == s.answer_digest for b, s in pairs) if None not in known else None,
    }


def _rate(n: float, d: float) -> Optional[float]:
    return n / d if d else None


def per_category(samples: Sequence[RequestSample]) -> list[dict]:
    """Speedup and acceptance per prompt category; [] with fewer than two categories."""
    spec = [s for s in samples if s.model == SPECULATIVE]
    categories = list(dict.fromkeys(s.category for s in spec))
    if len(categories) < 2:
        return []
    pairs = paired(samples)
    rows = []
    for c in categories:
        mine = [(b, s) for b, s in pairs if s.category == c]
        speedup, lo, hi = paired_speedup([b.latency_s for b, _ in mine], [s.latency_s for _, s in mine])
        acc = acceptance_summary(request_acceptance_counts([s for s in spec if s.category == c]))
        rounds_known = bool(acc["draft_length_counts"]) or acc["steps"] > 0
        rows.append(
            {
                "category": c or UNCATEGORISED,
                "prompts": len({s.prompt for s in spec if s.category == c}),
                "turns": len({(s.prompt, s.turn) for s in spec if s.category == c}),
                "requests": len(mine),
                "speedup": speedup,
                "speedup_ci95": [lo, hi],
                "mean_acceptance_length": acc["mean_acceptance_length"],
                "acceptance_rate": acc["acceptance_rate"],
                "rounds_without_speculation_share": acc["rounds_without_speculation_share"] if rounds_known else None,
            }
        )
    return rows


def summarize(
    samples: Sequence[RequestSample], k: Optional[int], policy: Optional[str] = None, ids: Sequence[str] = ()
) -> dict:
    base = [s for s in samples if s.model == BASELINE]
    spec = [s for s in samples if s.model == SPECULATIVE]
    pairs = paired(samples)
    speedup, lo, hi = paired_speedup([b.latency_s for b, _ in pairs], [s.latency_s for _, s in pairs])
    acc = acceptance_summary(request_acceptance_counts(spec))

    def side(xs: Sequence[RequestSample]) -> dict:
        return {
            "ttft_s": Summary.of([x.ttft_s for x in xs]).__dict__,
            "tpot_s": Summary.of([x.tpot_s for x in xs]).__dict__,
            "latency_s": Summary.of([x.latency_s for x in xs]).__dict__,
            "tokens_per_s": sum(x.tokens for x in xs) / sum(x.latency_s for x in xs),
            "tokens": sum(x.tokens for x in xs),
        }

    out = {
        "k": k,
        "draft_len_policy": policy,
        "requests": len(spec),
        "speedup": speedup,
        "speedup_ci95": [lo, hi],
        "baseline": side(base),
        "speculative": side(spec),
        "acceptance": acc,
        "categories": per_category(samples),
        **({"conversations": conv} if (conv := conversations(samples, ids)) else {}),
        **({"profile": prof} if (prof := request_profile(spec)) else {}),
        "samples": [s.__dict__ for s in samples],
    }
    kk = k if k is not None else max(len(acc["histogram"]) - 1, 0)
    if acc["source"] == lc.FROM_STREAMED_CHUNKS:  # no k or drafted counts: no α claimed
        out["warning"] = (
            f"speculative decoding is SLOWER than the baseline here ({speedup:.2f}x) at a mean "
            f"acceptance length of {acc['mean_acceptance_length']:.2f} (from {acc['source']})"
            if speedup < 1.0 and acc["mean_acceptance_length"] is not None
            else None
        )
    elif acc["mean_acceptance_length"] is not None or any(x.draft_lengths for x in spec):
        out["warning"] = low_acceptance_advice(_alpha_from(acc, kk), kk, None, speedup)
    else:  # no per-round figures: no α claimed
        out["warning"] = (
            f"speculative decoding is SLOWER than the baseline here ({speedup:.2f}x); the model reports "
            "no per-round acceptance (acceptance rate: "
            f"{'n/a' if acc['acceptance_rate'] is None else format(acc['acceptance_rate'], '.2f')})"
            if speedup < 1.0
            else None
        )
    return out


def request_profile(spec: Sequence[RequestSample]) -> Optional[dict]:
    """--profile: where the speculative requests' measured time went (records/profile.summarize); None without."""
    return profile_table((RequestProfile.from_json(s.profile), s.latency_s) for s in spec if s.profile is not None)


def _alpha_from(acc: dict, k: int) -> float:
    return solve_alpha(acc["mean_acceptance_length"] or 1.0, k)


def _nth_sample(
    client_factory: Callable[[], LLMClient],
    model: str,
    prompts: Sequence[Prompt],
    i: int,
    k: Optional[int],
    policy: Optional[str],
) -> RequestSample:
    """Request i of a run (prompts cycled) on its own client."""
    p, r = i % len(prompts), i // len(prompts)
    cl = client_factory()
    try:
        return RequestSample.of(model, p, r, _request(cl, model, prompts[p], k, policy), prompts[p].category)
    finally:
        cl.close()


def run_level(
    client_factory: Callable[[], LLMClient],
    model: str,
    prompts: Sequence[Prompt],
    concurrency: int,
    n: int,
    k: Optional[int],
    policy: Optional[str] = None,
) -> tuple[list[RequestSample], float]:
    """(samples, wall seconds) of n requests to one model with `concurrency` in flight."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        samples = list(pool.map(lambda i: _nth_sample(client_factory, model, prompts, i, k, policy), range(n)))
    return samples, time.perf_counter() - t0


def level_side(samples: Sequence[RequestSample], wall_s: float) -> dict:
    """One model at one level: throughput, latency summaries and raw samples."""
    tokens = sum(s.tokens for s in samples)
    return {
        "requests": len(samples),
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": total_throughput(tokens, wall_s),
        "ttft_s": Summary.of([s.ttft_s for s in samples]).__dict__,
        "tpot_s": Summary.of([s.tpot_s for s in samples]).__dict__,
        "latency_s": Summary.of([s.latency_s for s in samples]).__dict__,
        "samples": [s.__dict__ for s in samples],
    }


def sweep_row(
    concurrency: int,
    base: Sequence[RequestSample],
    base_wall_s: float,
    spec: Sequence[RequestSample],
    spec_wall_s: float,
) -> dict:
    """One sweep level; speedup = speculative / baseline total tok/s (not paired)."""
    b, s = level_side(base, base_wall_s), level_side(spec, spec_wall_s)
    return {
        "concurrency": concurrency,
        "requests": len(spec),
        BASELINE: b,
        SPECULATIVE: s,
        "speedup": s["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else math.nan,
        "acceptance": acceptance_summary(request_acceptance_counts(spec)),
    }


def sweep_measurement(
    client_factory: Callable[[], LLMClient],
    prompts: Sequence[Prompt],
    levels: Sequence[int],
    *,
    k: Optional[int] = None,
    requests_per_level: Optional[int] = None,
    policy: Optional[str] = None,
) -> Measurement:
    """The concurrency sweep as a phases.Measurement."""
    if not prompts:
        raise ValueError("the concurrency sweep needs at least one prompt")
    bad = [c for c in levels if c < 1]
    if bad:
        raise ValueError(f"concurrency levels must be >= 1, got {bad}")
    n_of = {c: -(-(requests_per_level or len(prompts)) // c) * c for c in levels}

    def every_level(model: str) -> Callable[[Progress], dict]:
        def run(progress: Progress) -> dict:
            out = {}
            for li, c in enumerate(levels):
                out[c] = run_level(client_factory, model, prompts, c, n_of[c], k, policy)
                if progress:
                    progress(li + 1, len(levels))
            return out

        return run

    def interleaved(progress: Progress) -> list[dict]:
        rows = []
        for li, c in enumerate(levels):
            order = (BASELINE, SPECULATIVE) if li % 2 == 0 else (SPECULATIVE, BASELINE)
            runs = {}
            for j, model in enumerate(order):
                runs[model] = run_level(client_factory, model, prompts, c, n_of[c], k, policy)
                if progress:
                    progress(2 * li + j + 1, 2 * len(levels))
            rows.append(sweep_row(c, *runs[BASELINE], *runs[SPECULATIVE]))
        return rows

    return Measurement(
        "concurrency sweep",
        2 * len(levels),
        interleaved,
        every_level(SPECULATIVE),
        every_level(BASELINE),
        lambda spec, base: [{**sweep_row(c, *base[c], *spec[c]), "order": PHASED_NOTE} for c in levels],
        len(levels),
    )


def _probed(client_factory: Callable[[], LLMClient], m: Measurement, progress: Progress):
    probe = client_factory()
    try:
        return _one(probe, m, progress)
    finally:
        probe.close()


def concurrency_sweep(
    client_factory: Callable[[], LLMClient],
    prompts: Sequence[Prompt],
    levels: Sequence[int],
    *,
    k: Optional[int] = None,
    requests_per_level: Optional[int] = None,
    progress: Progress = None,
    policy: Optional[str] = None,
) -> list[dict]:
    """Per level C, N requests with C in flight to each model (order alternating by level).

    N = requests_per_level (default len(prompts)) rounded up to a multiple of C: no part-empty last wave."""
    m = sweep_measurement(client_factory, prompts, levels, k=k, requests_per_level=requests_per_level, policy=policy)
    return _probed(client_factory, m, progress)


@dataclass(frozen=True)
class SLO:
    """Per-request latency targets for goodput (None: no limit)."""

    ttft_s: Optional[float] = None
    tpot_s: Optional[float] = None

    def met(self, s: RequestSample) -> bool:
        return (self.ttft_s is None or s.ttft_s <= self.ttft_s) and (
            self.tpot_s is None or s.tpot_s is None or s.tpot_s <= self.tpot_s
        )


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """n seeded Poisson arrival times (s) at `rate` requests/s."""
    if rate <= 0:
        raise ValueError(f"the request rate must be > 0 requests/s, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def run_rate(
    client_factory: Callable[[], LLMClient],
    model: str,
    prompts: Sequence[Prompt],
    arrivals: Sequence[float],
    k: Optional[int],
    policy: Optional[str] = None,
) -> tuple[list[RequestSample], float]:
    """Open loop: one request per arrival time; (samples, seconds from first arrival to last answer)."""

    def one(i: int) -> RequestSample:
        delay = t0 + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return _nth_sample(client_factory, model, prompts, i, k, policy)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(arrivals)) as pool:
        samples = list(pool.map(one, range(len(arrivals))))
    return samples, time.perf_counter() - t0 - arrivals[0]


def rate_row(
    rate: float,
    base: Sequence[RequestSample],
    base_wall_s: float,
    spec: Sequence[RequestSample],
    spec_wall_s: float,
    slo: SLO,
) -> dict:
    """Both sides at one request rate, with goodput = requests/s meeting the SLO (upstream-facts: vllm-goodput)."""
    row = sweep_row(0, base, base_wall_s, spec, spec_wall_s)
    del row["concurrency"]
    for model, samples, wall in ((BASELINE, base, base_wall_s), (SPECULATIVE, spec, spec_wall_s)):
        met = sum(slo.met(x) for x in samples)
        row[model].update(slo_met=met, goodput_rps=met / wall, request_rps=len(samples) / wall)
    g = row[BASELINE]["goodput_rps"]
    row.update(
        request_rate=rate,
        slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        goodput_ratio=row[SPECULATIVE]["goodput_rps"] / g if g else math.nan,
    )
    return row


def rate_measurement(
    client_factory: Callable[[], LLMClient],
    prompts: Sequence[Prompt],
    rate: float,
    n: int,
    *,
    k: Optional[int] = None,
    policy: Optional[str] = None,
    slo: SLO = SLO(),
    seed: int = 0,
) -> Measurement:
    """The request-rate run as a phases.Measurement."""
    if n < 1:
        raise ValueError(f"the request-rate run needs at least one request, got {n}")
    arrivals = poisson_arrivals(rate, n, seed)

    def side(model: str) -> Callable[[Progress], tuple[list[RequestSample], float]]:
        def run(progress: Progress) -> tuple[list[RequestSample], float]:
            out = run_rate(client_factory, model, prompts, arrivals, k, policy)
            if progress:
                progress(1, 1)
            return out

        return run

    def interleaved(progress: Progress) -> dict:
        runs = {}
        for j, model in enumerate((BASELINE, SPECULATIVE)):
            runs[model] = run_rate(client_factory, model, prompts, arrivals, k, policy)
            if progress:
                progress(j + 1, 2)
        return rate_row(rate, *runs[BASELINE], *runs[SPECULATIVE], slo)

    return Measurement(
        f"request rate {rate:g}/s",
        2,
        interleaved,
        side(SPECULATIVE),
        side(BASELINE),
        lambda spec, base: {**rate_row(rate, *base, *spec, slo), "order": PHASED_NOTE},
        1,
    )


def request_rate_run(
    client_factory: Callable[[], LLMClient],
    prompts: Sequence[Prompt],
    rate: float,
    n: int,
    *,
    k: Optional[int] = None,
    policy: Optional[str] = None,
    slo: SLO = SLO(),
    seed: int = 0,
    progress: Progress = None,
) -> dict:
    """The same Poisson arrivals to each model: throughput, latency and goodput side by side."""
    m = rate_measurement(client_factory, prompts, rate, n, k=k, policy=policy, slo=slo, seed=seed)
    return _probed(client_factory, m, progress)


def tune_k(
    client: LLMClient,
    prompts: Sequence[Prompt],
    ks: Sequence[int],
    *,
    repeats: int = 1,
    progress: Progress = None,
    adaptive: bool = True,
    note: Callable[[str], None] = lambda s: None,
) -> dict:
    """A/B each fixed k (and adaptive at max(ks)); recommends the fastest fixed k, 0 when none pays."""
    runs = [(Policy.FIXED.value, k) for k in ks] + ([(Policy.ADAPTIVE.value, max(ks))] if adaptive else [])
    ms = [
        ab_measurement(client, prompts, k=k, repeats=repeats, warmup=1 if i == 0 else 0, policy=policy)
        for i, (policy, k) in enumerate(runs)
    ]
    done = [0]
    stages = len(runs) + (1 if is_phased(client) else 0)  # phased: + one baseline half

    @contextlib.contextmanager
    def counted(label: str, total: int):
        yield
        done[0] += 1
        if progress:
            progress(done[0], stages)

    results = measure(client, ms, stage=lambda label, total: (counted(label, total), None), note=note)
    rows = []
    for (policy, k), res in zip(runs, results):
        acc = res["acceptance"]
        rows.append(
            {
                "policy": policy,
                "k": k,
                "speedup": res["speedup"],
                "speedup_ci95": res["speedup_ci95"],
                "acceptance_rate": acc["acceptance_rate"],
                "mean_acceptance_length": acc["mean_acceptance_length"],
                "mean_draft_length": acc["mean_draft_length"],
                "rounds_without_speculation_share": acc["rounds_without_speculation_share"],
                "spec_tokens_per_s": res["speculative"]["tokens_per_s"],
                "baseline_tokens_per_s": res["baseline"]["tokens_per_s"],
            }
        )
    fixed = [r for r in rows if r["policy"] == Policy.FIXED]
    best = max(fixed, key=lambda r: r["speedup"])
    out = {
        "sweep": rows,
        "recommended_k": best["k"] if best["speedup"] > 1.0 else 0,
        "note": (
            "speculation does not pay at any fixed k on this workload; serve the baseline (k=0) or the adaptive policy"
            if best["speedup"] <= 1.0
            else f"fixed k={best['k']} gives {best['speedup']:.2f}x"
        ),
    }
    ad = next((r for r in rows if r["policy"] == Policy.ADAPTIVE), None)
    if ad is not None:
        out["adaptive_vs_best_fixed"] = {
            "adaptive": ad["speedup"],
            "adaptive_ci95": ad["speedup_ci95"],
            "best_fixed_k": best["k"],
            "best_fixed": best["speedup"],
            "best_fixed_ci95": best["speedup_ci95"],
            "ratio": ad["speedup"] / best["speedup"],
        }
    return out
