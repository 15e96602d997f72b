"""How many tokens to draft each round: fixed k, or adaptive k from measured costs and acceptance (k = 0 included).

One pure-Python policy for the BLS's draft -> verify loop and the reference engine's in-engine EAGLE chain. Adaptive
(the default) maximises each round's expected tokens per second from the request's acceptance and call costs measured
per load level; where speculation does not pay it decodes a run of tokens instead, probing again after the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence

from .speculation import POLICIES, Policy, expected_tokens

DECAY = 0.8  # per-round weight of a request's acceptance history (recent rounds count more)
PRIOR_ROUNDS = 2.0  # weight of the deployment's acceptance in a request's estimate
COST_DECAY = 0.95  # per-observation weight of the shared cost measurements
MIN_SAMPLES = 3.0  # rounds of a proposal length before its measured acceptance is used
MIN_RUN = 1  # tokens of the first round without speculation; doubles per round
MAX_RUN = 64  # longest run between probes
CONFIDENCE_DECAY = 0.99  # per-observation weight of a proposal bucket's acceptance (about its last 100 tokens)
MATCH_LEVELS, AGREE_LEVELS = 6, 4  # buckets: match length 1, 2, 3-4, 5-8, 9-16, 17+; agreeing occurrences 1, 2, 3-4, 5+


class _EW:
    """Recency-weighted mean."""

    __slots__ = ("w", "s")

    def __init__(self):
        self.w = 0.0
        self.s = 0.0

    def add(self, x: float, decay: float = COST_DECAY) -> None:
        self.w = self.w * decay + 1.0
        self.s = self.s * decay + x

    @property
    def mean(self) -> Optional[float]:
        return self.s / self.w if self.w else None


def _line(table: dict[int, _EW], proportional: bool = False) -> Optional[tuple[float, float]]:
    """(a, b) of seconds ≈ a + b·n by weighted least squares, b ≥ 0; one n: flat, or through 0 if `proportional`."""
    pts = [(n, e.mean, e.w) for n, e in table.items() if e.w]
    if not pts:
        return None
    W = sum(w for _, _, w in pts)
    nm = sum(n * w for n, _, w in pts) / W
    ym = sum(y * w for _, y, w in pts) / W
    var = sum(w * (n - nm) ** 2 for n, _, w in pts)
    if var <= 0:
        return (0.0, ym / nm) if proportional and nm > 0 else (ym, 0.0)
    b = max(0.0, sum(w * (n - nm) * (y - ym) for n, y, w in pts) / var)
    return ym - b * nm, b


def _at(line: tuple[float, float], n: float, floor: float) -> float:
    return max(floor, line[0] + line[1] * n)


class Timings:
    """Seconds of the deployment's calls at one load level, recency-weighted."""

    def __init__(self):
        self.target: dict[int, _EW] = {}  # tokens submitted (drafts + 1) -> seconds of the target call
        self.draft: dict[int, _EW] = {}  # k -> seconds of the draft call (or the proposer)
        self.runs: dict[int, _EW] = {}  # tokens of a run without speculation -> seconds of its target call
        self.gain = _EW()  # seconds a useful draft-free round saved against decoding its tokens

    def verify_line(self) -> Optional[tuple[float, float]]:
        return _line(self.target)

    def verify_s(self, n: int) -> Optional[float]:
        line = self.verify_line()
        return None if line is None else _at(line, n, 1e-6)

    def draft_line(self) -> Optional[tuple[float, float]]:
        return _line(self.draft, proportional=True)

    def draft_s(self, k: int) -> float:
        line = self.draft_line()
        return 0.0 if line is None else _at(line, k, 0.0)

    def decode_s(self) -> Optional[float]:
        """Seconds per token without speculation: the runs' slope, else their mean per token, else one target call."""
        line = _line(self.runs)
        if line is None:
            return self.verify_s(1)
        if line[1] > 0:
            return line[1]
        n = sum(m * e.w for m, e in self.runs.items()) / sum(e.w for e in self.runs.values())
        return line[0] / n

    def call_overhead_s(self) -> Optional[float]:
        """Seconds a target call costs beyond its tokens (the runs' intercept)."""
        line = _line(self.runs)
        return None if line is None or line[1] <= 0 else max(0.0, line[0])


def load_level(active: int) -> int:
    """Requests in the loop -> load level: 1, 2, 3-4, 5-8, 9-16, ..."""
    return (max(1, active) - 1).bit_length() + 1


Evidence = tuple[int, int, int]  # a proposed token's: (match length, occurrences agreeing on it, live occurrences)


def evidence_key(ev: Evidence) -> tuple[int, int, bool]:
    """A proposed token's bucket: match length and agreeing occurrences in levels, and whether all of them agreed."""
    match, agreeing, live = ev
    return min(load_level(match), MATCH_LEVELS), min(load_level(agreeing), AGREE_LEVELS), agreeing >= live


class Confidence:
    """Draft-free: how often a proposed token is accepted once the tokens before it were, per evidence bucket.

    Starts from the rule of succession over the earlier occurrences ((agreeing + 1) / (live + 2)) with the weight of
    PRIOR_ROUNDS tokens, then follows what verification accepted, recency-weighted."""

    def __init__(self):
        self.table: dict[tuple[int, int, bool], _EW] = {}

    def p(self, ev: Evidence) -> float:
        prior = (ev[1] + 1) / (ev[2] + 2)
        e = self.table.get(evidence_key(ev))
        return prior if e is None else (e.s + PRIOR_ROUNDS * prior) / (e.w + PRIOR_ROUNDS)

    def observe(self, evidence: tuple[Evidence, ...], accepted: int) -> None:
        """Tokens 1..accepted were accepted, the next one (if proposed) was not; those after it tell nothing."""
        for i, ev in enumerate(evidence[: accepted + 1]):
            self.table.setdefault(evidence_key(ev), _EW()).add(1.0 if i < accepted else 0.0, CONFIDENCE_DECAY)


class CostModel:
    """What one deployment measured while serving: call seconds per load level, and acceptance statistics."""

    def __init__(self):
        self.levels: dict[int, Timings] = {}
        self.acceptance = _EW()  # per-round successes/(successes + failures)
        self.useful = _EW()  # draft-free: share of consultations that sped a round up
        self.accepted_by_len: dict[int, _EW] = {}  # draft-free: tokens proposed -> tokens accepted
        self.run_reached = _EW()  # the doubling run's length after each round that settled it
        self.confidence = Confidence()  # draft-free: acceptance of proposed tokens by their evidence

    def start_run(self) -> int:
        """A new request's first doubling run: half what recent requests reached, so it skips losing probes."""
        reached = self.run_reached.mean
        if reached is None:
            return MIN_RUN
        run = MIN_RUN
        while run * 4 <= reached and run * 2 <= MAX_RUN:
            run *= 2
        return run

    def at(self, active: int = 1) -> Timings:
        """The timings to decide with: this load's level, else the nearest measured one (the lower on a tie)."""
        lvl = load_level(active)
        have = [k for k, t in self.levels.items() if t.target or t.runs]
        if lvl in have or not have:
            return self.levels.setdefault(lvl, Timings())
        return self.levels[min(have, key=lambda k: (abs(k - lvl), k))]

    def level(self, active: int = 1) -> Timings:
        """The timings observations at this load go to."""
        return self.levels.setdefault(load_level(active), Timings())

    def seed(
        self, verify_s: Mapping[int, float], draft_s: Mapping[int, float], decode_s: float, active: int = 1
    ) -> None:
        """Costs measured before serving (target by tokens, draft by k, one decode step), one observation each."""
        t = self.level(active)
        for n, s in verify_s.items():
            t.target.setdefault(n, _EW()).add(s)
        for k, s in draft_s.items():
            t.draft.setdefault(k, _EW()).add(s)
        t.runs.setdefault(1, _EW()).add(decode_s)

    def accepted_s(self, d: int) -> Optional[float]:
        """Draft-free: mean tokens accepted of a d-token proposal, once measured over MIN_SAMPLES rounds."""
        e = self.accepted_by_len.get(d)
        return e.mean if e is not None and e.w >= MIN_SAMPLES else None


@dataclass(frozen=True)
class Decision:
    """What the policy chose for one round, and why; only `observe` changes the policy's state."""

    k: int  # the draft length chosen (draft-free: the most the proposer may offer); 0 = no speculation this round
    run_len: int  # tokens the target decodes in one call if the round does not speculate
    speculate: bool  # verify drafts this round (draft-free: confirmed after the proposer answered)
    pays: bool = True  # the estimate said speculation beats decoding (True while nothing is measured)
    probe: bool = False  # speculating although it does not pay: re-measuring acceptance after a run
    evaluated: bool = False  # the adaptive policy weighed speculation against decoding
    doubling: bool = False  # run_len is the request's doubling run (observe doubles it after a run)
    load: int = 1  # requests in the loop when decided
    keep: Optional[int] = None  # draft-free with evidence: how many of the proposed tokens to verify (None: all)
    evidence: tuple[Evidence, ...] = ()  # ... and their evidence, which observe learns acceptance from


@dataclass(frozen=True)
class Outcome:
    """What one round did; `empty`: a draft-free proposer proposed nothing."""

    drafted: int
    accepted: int
    tokens: int
    draft_s: float
    target_s: float
    empty: bool = False
    prefill: bool = False  # the target call also read the prompt: its seconds are not a verification's or a run's


@dataclass
class RequestPolicy:
    """One request's side of the policy: its acceptance history and its run length."""

    policy: str
    costs: CostModel
    prior_alpha: float
    successes: float = 0.0
    failures: float = 0.0
    useful: float = 0.0  # draft-free: recency-weighted consultations that sped a round up ...
    consulted: float = 0.0  # ... out of all consultations
    own_accepted: float = 0.0  # draft-free: recency-weighted tokens accepted ...
    own_expected: float = 0.0  # ... and what the deployment's acceptance expected of them
    run: int = MIN_RUN  # tokens of the next doubling run
    prior_weight: float = PRIOR_ROUNDS  # decays like the request's own rounds, so α̂ can reach 0
    probe: bool = False  # the next evaluated round speculates whatever the estimate says

    @property
    def adaptive(self) -> bool:
        return self.policy == Policy.ADAPTIVE

    @property
    def alpha(self) -> float:
        s = self.successes + self.prior_weight * self.prior_alpha
        return s / (self.successes + self.failures + self.prior_weight)

    def expected(self, d: int, draft_free: bool) -> float:
        """Tokens a round with d drafts is expected to yield; draft-free proposals are not i.i.d., so their acceptance
        is measured per proposal length."""
        if draft_free:
            acc = self.costs.accepted_s(d)
            if acc is not None:
                scale = (self.own_accepted + PRIOR_ROUNDS) / (self.own_expected + PRIOR_ROUNDS)
                return 1.0 + min(d, acc * scale)
        return expected_tokens(self.alpha, d)

    def speedups(self, ds, active: int, proposer_s: Optional[float] = None) -> Optional[list[float]]:
        """Per d in ds: expected tokens/s of a d-draft round over decoding's (> 1 pays); None while unmeasured."""
        t = self.costs.at(active)
        verify, t_dec = t.verify_line(), t.decode_s()
        if verify is None or t_dec is None:
            return None
        draft = t.draft_line() if proposer_s is None else None
        out = []
        for d in ds:
            d_s = proposer_s if proposer_s is not None else (0.0 if draft is None else _at(draft, d, 0.0))
            out.append(self.expected(d, proposer_s is not None) * t_dec / (d_s + _at(verify, d + 1, 1e-6)))
        return out

    def best_k(self, cap: int, active: int, proposer_s: Optional[float] = None) -> tuple[int, bool]:
        """(k, pays): the best draft length in 1..cap and whether it beats decoding without speculation."""
        if cap <= 0:
            return 0, False
        gains = self.speedups(range(1, cap + 1), active, proposer_s)
        if gains is None:  # nothing measured yet: speculate at the cap (the fixed policy's choice)
            return cap, True
        gain, k = max(zip(gains, range(1, cap + 1)), key=lambda t: (t[0], -t[1]))  # a tie goes to the shorter draft
        return k, gain > 1.0

    def decide(self, cap: int, active: int, remaining: int, *, draft_free: bool, first: bool = False) -> Decision:
        """The next round, before anything is proposed; cap: the most drafts it may have. Draft-free: how much to ask
        the proposer for (`confirm` then decides on its proposal)."""
        run_len, doubling = self._run_len(remaining, active, draft_free, first)
        base = Decision(k=max(cap, 0), run_len=run_len, speculate=cap > 0, doubling=doubling, load=active)
        if not self.adaptive or cap <= 0:
            return base
        if draft_free:
            return replace(base, k=cap if active <= 1 else self.best_k(cap, active, 0.0)[0])
        k, pays = self.best_k(cap, active)
        speculate = pays or self.probe
        if pays and doubling:  # speculation pays: the doubling run starts over (should the draft come back empty)
            base = replace(base, run_len=max(1, min(MIN_RUN, remaining)))
        return replace(
            base, k=k if speculate else 0, speculate=speculate, pays=pays, probe=speculate and not pays, evaluated=True
        )

    def confirm(
        self, decision: Decision, drafted: int, proposer_s: float, evidence: Optional[Sequence[Evidence]] = None
    ) -> Decision:
        """Draft-free: verify the `drafted` proposed tokens, or run without speculation instead. With the proposal's
        per-token evidence, adaptive verifies the prefix that maximises expected tokens per second; fixed, the control
        arm, verifies all of it (the same request verifies the same lengths whatever the server learned)."""
        if evidence is not None and drafted and self.adaptive:
            n = self.proposal_len(evidence[:drafted], decision.load)
            probe = self.adaptive and self.probe and n == 0  # re-measure the first token's acceptance
            keep = 1 if probe else n
            return replace(
                decision,
                speculate=keep > 0,
                keep=keep,
                evidence=tuple(evidence[:keep]),
                pays=n > 0,
                probe=probe,
                evaluated=self.adaptive,
            )
        if not self.adaptive or drafted == 0:
            return replace(decision, speculate=drafted > 0)
        gains = self.speedups([drafted], decision.load, proposer_s)
        pays = gains is None or gains[0] > 1.0
        speculate = pays or self.probe
        return replace(decision, speculate=speculate, pays=pays, probe=speculate and not pays, evaluated=True)

    def proposal_len(self, evidence: Sequence[Evidence], active: int) -> int:
        """The prefix of a proposal to verify: n maximising (1 + Σ_{i≤n} P(tokens 1..i accepted)) / verify_s(n + 1)
        against decoding's 1 / decode_s (n = 0). Flat verification keeps every token that may be accepted; a costlier
        one keeps only those whose chance pays for their share of the call. Nothing measured yet: all of it."""
        t = self.costs.at(active)
        verify, t_dec = t.verify_line(), t.decode_s()
        if verify is None or t_dec is None:
            return len(evidence)
        best, best_rate, reach, expected = 0, 1.0 / t_dec, 1.0, 1.0
        for n, ev in enumerate(evidence, 1):
            reach *= self.costs.confidence.p(ev)
            expected += reach
            rate = expected / _at(verify, n + 1, 1e-6)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def _run_len(self, remaining: int, active: int, draft_free: bool, first: bool) -> tuple[int, bool]:
        """(tokens to decode without speculation, whether that is the doubling run).

        Draft-free: m = sqrt(2·O / (q·G)) minimises per-token overhead O/m plus missed proposals q·G·(m − 1)/2
        (q: share of useful consultations, G: seconds one saved). Otherwise the run doubles until speculation pays."""
        if first or not self.adaptive:
            return 1, False
        t = self.costs.at(active)
        o, g = t.call_overhead_s(), t.gain.mean
        if draft_free and o is not None and g is not None and g > 0:
            q = (self.useful + PRIOR_ROUNDS * (self.costs.useful.mean or 0.0)) / (self.consulted + PRIOR_ROUNDS)
            n = MAX_RUN if q <= 0 else round(math.sqrt(2 * o / (q * g)))
            return max(1, min(n, MAX_RUN, remaining)), False
        return max(1, min(self.run, remaining)), True

    def observe(self, decision: Decision, outcome: Outcome, *, draft_free: bool) -> None:
        """Learn from one round: settle the probe and run length, then record acceptance and costs."""
        if decision.evaluated:
            self.probe = False
            if decision.pays:
                self.run = MIN_RUN
        if not outcome.drafted and decision.doubling:  # a round without speculation decoded the doubling run
            self.run = min(MAX_RUN, self.run * 2)
        if self.adaptive and not draft_free and (decision.evaluated or decision.doubling):
            # not draft-free: a long starting run would skip the copying its proposer finds
            self.costs.run_reached.add(self.run)
        drafted, accepted = outcome.drafted, outcome.accepted
        if decision.evidence and drafted:
            self.costs.confidence.observe(decision.evidence[:drafted], accepted)
        if draft_free and drafted:
            acc = self.costs.accepted_s(drafted)
            self.own_accepted = self.own_accepted * DECAY + accepted
            self.own_expected = self.own_expected * DECAY + (accepted if acc is None else acc)
            self.costs.accepted_by_len.setdefault(drafted, _EW()).add(accepted)
        if draft_free and self.adaptive:
            hit = 1.0 if accepted else 0.0
            self.useful = self.useful * DECAY + hit
            self.consulted = self.consulted * DECAY + 1.0
            self.costs.useful.add(hit)
            t_dec = self.costs.at(decision.load).decode_s()
            if accepted and t_dec is not None and not outcome.prefill:
                self.costs.level(decision.load).gain.add(outcome.tokens * t_dec - outcome.target_s - outcome.draft_s)
        if drafted:
            fail = 1.0 if accepted < drafted else 0.0
            self.successes = self.successes * DECAY + accepted
            self.failures = self.failures * DECAY + fail
            self.prior_weight *= DECAY
            self.costs.acceptance.add(accepted / (accepted + fail) if accepted + fail else 1.0)
            if not outcome.prefill:
                t = self.costs.level(decision.load)
                t.target.setdefault(drafted + 1, _EW()).add(outcome.target_s)
                t.draft.setdefault(0 if draft_free else drafted, _EW()).add(outcome.draft_s)
        elif not self.adaptive:  # the fixed policy's one-token verification of nothing
            if not outcome.prefill:
                self.costs.level(decision.load).target.setdefault(1, _EW()).add(outcome.target_s)
        else:
            if outcome.tokens > 0 and not outcome.prefill:
                self.costs.level(decision.load).runs.setdefault(outcome.tokens, _EW()).add(outcome.target_s)
            self.probe = not outcome.empty  # a run the policy chose: the next evaluated round probes


class DraftLengthPolicy:
    """The deployment's policy: the shared cost model and the requests in the loop right now."""

    def __init__(self, default: str = Policy.ADAPTIVE.value):
        if default not in POLICIES:
            raise ValueError(f"draft_len_policy {default!r}: use one of {', '.join(POLICIES)}")
        self.default = default
        self.costs = CostModel()
        self.active = 0

    def start(self, policy: Optional[str] = None) -> RequestPolicy:
        p = policy or self.default
        if p not in POLICIES:
            raise ValueError(f"draft_len_policy {p!r}: use one of {', '.join(POLICIES)}")
        prior = self.costs.acceptance.mean
        return RequestPolicy(
            policy=p, costs=self.costs, prior_alpha=0.5 if prior is None else prior, run=self.costs.start_run()
        )
