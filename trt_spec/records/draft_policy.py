"""How many tokens to draft each round: fixed k, or adaptive k chosen from measured costs and acceptance (k = 0
included).

Pure Python, no Triton, no torch, one policy for both loops: the BLS's draft -> verify loop
(trt_spec/in_triton/speculative_loop.py, inside the `tensorrt_llm_bls` model, over the CPU reference engine and the
TensorRT-LLM engines) and the reference engine's in-engine EAGLE chain (trt_spec/reference/batching.py: a round is a
step drafting k tokens with the head, or a run of plain decode steps that leave the head idle).

Fixed (`draft_len_policy: fixed`): every round drafts k = the request's num_draft_tokens (a draft-free proposer may
offer fewer); a round with nothing to verify asks the target for one token. This is what trt-spec did before.

Adaptive (`draft_len_policy: adaptive`, the default) maximises the request's expected tokens per second, per round:
- Acceptance. A draft model's tokens: each request keeps a recency-weighted per-token acceptance α̂ (accepted tokens are
  successes, the first rejected token of a round a failure; weight DECAY per round), started from the deployment's
  running acceptance with the weight of PRIOR_ROUNDS rounds, a weight that decays with the request's own rounds like
  any older evidence (so a draft that is never accepted drives α̂ to 0, not to a floor the prior sets); a round with
  d drafts yields E(d) = (1 − α̂^(d+1)) / (1 − α̂) (Leviathan et al.'s i.i.d. model). Draft-free proposals are not
  i.i.d. (a copied span is right as a whole or breaks early): E(d) = 1 + the deployment's measured mean accepted
  tokens of d-token proposals, scaled by how this request's proposals did against that mean.
- Costs, measured while serving (shared by all requests, recency-weighted) and kept per load level (1, 2, 3-4, 5-8, …
  requests in the loop: a call batched with more requests costs more; a level without measurements borrows the
  nearest one's): the target call's seconds by tokens submitted, V(n) = a + b·n, a line fitted to the per-n means; the
  draft's seconds by k, D(k) (the draft engine) or the proposer's seconds (draft-free); t_dec, the seconds per token of
  a run without speculation (the slope of the runs' seconds by length), and the call overhead O (their intercept).
  This is what makes the policy load-aware: at a load where verifying k tokens costs more than it yields (compute-bound
  batches), it drafts shorter or stops (the role of TensorRT-LLM's draft_len_schedule by batch size, from measurements).
- Draft-target: k* = argmax over 1..K of E(k) / (D(k) + V(k + 1)), K = min(num_draft_tokens, remaining − 1);
  speculate with k* if that rate beats 1 / t_dec, else run without speculation: one target call decodes a run of
  tokens (from MIN_RUN, or half the run the deployment's requests recently reached, doubling with each
  run in a row, at most MAX_RUN); after a run the next round drafts anyway to
  re-measure (a probe).
- Draft-free: the proposer costs nothing to consult, so it proposes first (alone in the loop its confidence sets the
  length; with others in flight capped at the best k); the proposal is verified if E(d) / V(d + 1) beats 1 / t_dec.
  An empty or rejected proposal becomes a run of m = sqrt(2·O / (q·G)) tokens (q: the share of consultations that
  were useful, G: the seconds a useful one saved; see run_len).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from .speculation import POLICIES, Policy, expected_tokens

DECAY = 0.8  # per-round weight of a request's acceptance history (recent rounds count more)
PRIOR_ROUNDS = 2.0  # weight of the deployment's acceptance in a request's estimate
COST_DECAY = 0.95  # per-observation weight of the shared cost measurements
MIN_SAMPLES = 3.0  # rounds of a proposal length before its measured acceptance is used
MIN_RUN = 1  # tokens of the first round without speculation (decoded in one target call); doubles per round
MAX_RUN = 64  # longest run between probes


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
    """(a, b) of seconds ≈ a + b·n, weighted least squares over the per-n means; b ≥ 0. With one n: flat, or through
    the origin when `proportional` (a draft engine decodes its k tokens one after another)."""
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
        self.gain = _EW()  # seconds a useful draft-free speculative round saved against decoding its tokens

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
        """Seconds per token without speculation: the slope of the runs' seconds by length (the call's overhead
        apart) once runs of two lengths were measured, else their mean per token, else a one-token target call."""
        line = _line(self.runs)
        if line is None:
            return self.verify_s(1)
        if line[1] > 0:
            return line[1]
        n = sum(m * e.w for m, e in self.runs.items()) / sum(e.w for e in self.runs.values())
        return line[0] / n

    def call_overhead_s(self) -> Optional[float]:
        """Seconds a target call costs beyond its tokens (the runs' intercept), once runs of two lengths were seen."""
        line = _line(self.runs)
        return None if line is None or line[1] <= 0 else max(0.0, line[0])


def load_level(active: int) -> int:
    """Requests in the loop -> load level: 1, 2, 3-4, 5-8, 9-16, ... (costs are measured per level)."""
    return (max(1, active) - 1).bit_length() + 1


class CostModel:
    """What the deployment measured while serving (one per BLS instance, shared by its requests): call seconds per
    load level (the same call costs more with more requests batched with it, so costs measured at one load never
    decide at another while that one has its own), and acceptance statistics."""

    def __init__(self):
        self.levels: dict[int, Timings] = {}
        self.acceptance = _EW()  # per-round acceptance successes/(successes + failures), all requests
        self.useful = _EW()  # draft-free: share of proposer consultations that sped a round up, all requests
        self.accepted_by_len: dict[int, _EW] = {}  # draft-free: tokens proposed -> tokens of them accepted
        self.run_reached = _EW()  # the doubling run's length after each round that settled it, all requests

    def start_run(self) -> int:
        """The doubling run a new request starts from: half the run the deployment's requests have recently been
        reaching (a power of two, at least MIN_RUN), so that where probes keep losing a new request does not pay
        for the whole doubling again (1, 2, 4 ... probes), while one probe still comes within that many tokens."""
        reached = self.run_reached.mean
        if reached is None:
            return MIN_RUN
        run = MIN_RUN
        while run * 4 <= reached and run * 2 <= MAX_RUN:
            run *= 2
        return run

    def at(self, active: int = 1) -> Timings:
        """The timings to decide with at this load: its own level's once it has measured a target call, else the
        nearest level that has (the lower on a tie), else its own (empty)."""
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
        """Costs measured before serving (an EAGLE engine times its forwards and its head at load): seconds of a target
        call by tokens submitted, of the draft by k, and of one plain decode step, at this load. Each counts as one
        observation, so what serving measures takes over (recency-weighted)."""
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
    """What the policy chose for one round, and why. `decide` and `confirm` only read the policy; everything a
    decision changes in it (the probe used up, the run length reset or doubled) happens in `observe`."""

    k: int  # the draft length chosen (draft-free: the most the proposer may offer); 0 = no speculation this round
    run_len: int  # tokens the target decodes in one call if the round does not speculate
    speculate: bool  # verify drafts this round (draft-free: confirmed after the proposer answered)
    pays: bool = True  # the estimate said speculation beats decoding (True while nothing is measured)
    probe: bool = False  # speculating although it does not pay: re-measuring acceptance after a run
    evaluated: bool = False  # the adaptive policy weighed speculation against decoding (observe settles the probe)
    doubling: bool = False  # run_len is the request's doubling run (observe doubles it after a run)
    load: int = 1  # requests in the loop when decided: the round's costs are observed at this load


@dataclass(frozen=True)
class Outcome:
    """What one round did: drafts verified and accepted, tokens it added, seconds proposing and in the target call;
    `empty`: a draft-free proposer proposed nothing."""

    drafted: int
    accepted: int
    tokens: int
    draft_s: float
    target_s: float
    empty: bool = False


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
    own_expected: float = 0.0  # ... and what the deployment's acceptance by length expected of the same proposals
    run: int = MIN_RUN  # tokens of the next doubling run
    prior_weight: float = PRIOR_ROUNDS  # the deployment's acceptance counts as this many rounds, decaying as they do
    probe: bool = False  # the next evaluated round speculates whatever the estimate says (after a run)

    @property
    def adaptive(self) -> bool:
        return self.policy == Policy.ADAPTIVE

    @property
    def alpha(self) -> float:
        s = self.successes + self.prior_weight * self.prior_alpha
        return s / (self.successes + self.failures + self.prior_weight)

    def expected(self, d: int, draft_free: bool) -> float:
        """Tokens a round with d drafts is expected to yield. Draft-free proposals are not i.i.d. (a copied span is
        right as a whole or breaks early), so their acceptance is measured by proposal length over the deployment and
        scaled by how this request's proposals did against it; a draft model's tokens follow Leviathan's model."""
        if draft_free:
            acc = self.costs.accepted_s(d)
            if acc is not None:
                scale = (self.own_accepted + PRIOR_ROUNDS) / (self.own_expected + PRIOR_ROUNDS)
                return 1.0 + min(d, acc * scale)
        return expected_tokens(self.alpha, d)

    def speedups(self, ds, active: int, proposer_s: Optional[float] = None) -> Optional[list[float]]:
        """For each d in ds, a round with d drafts' expected tokens per second over decoding's (> 1: it pays), from
        the costs at this load, fitted once (None while the target's cost is unmeasured); proposer_s given: a
        draft-free proposer that took that long."""
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
        """The next round, before anything is proposed. cap: the most drafts this round may have (the request's k,
        within its remaining budget); active: requests in the loop; first: the request's first round (it decodes
        one token when it does not speculate, so the first token never waits for a run).

        Draft-target: k* = the best draft length, speculating when it pays or as the probe after a run. Draft-free:
        the proposer is free to consult, so the decision is how much to ask for (alone in the loop its own
        confidence sets the length; with others in flight, the length that maximises the net rate), and `confirm`
        decides on what it proposed."""
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

    def confirm(self, decision: Decision, drafted: int, proposer_s: float) -> Decision:
        """Draft-free: verify the `drafted` proposed tokens, or run without speculation instead."""
        if not self.adaptive or drafted == 0:
            return replace(decision, speculate=drafted > 0)
        gains = self.speedups([drafted], decision.load, proposer_s)
        pays = gains is None or gains[0] > 1.0
        speculate = pays or self.probe
        return replace(decision, speculate=speculate, pays=pays, probe=speculate and not pays, evaluated=True)

    def _run_len(self, remaining: int, active: int, draft_free: bool, first: bool) -> tuple[int, bool]:
        """(tokens to decode in a round without speculation, whether that is the doubling run). Fixed policy, and
        the first round: 1 (the target's verification of nothing).

        Draft-free: a run of m tokens saves (m − 1) call overheads O against m one-token rounds but consults the
        proposer m − 1 times less, each consultation useful with probability q (measured) and then worth G seconds
        (measured). Minimising O/m + q·G·(m − 1)/2 per token gives m = sqrt(2·O / (q·G)) (the square-root rule of
        batch sizing): short runs where matches come back often or calls are cheap, long ones in free text.
        Draft-target (and before O, q, G are measured): the run doubles with every round in a row without
        speculation and falls back to MIN_RUN when speculation pays."""
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
        """Learn from one round: settle what the decision owed (a probe used up; the run length reset when
        speculation paid, doubled after a doubling run), then account acceptance and costs at the decision's load."""
        if decision.evaluated:
            self.probe = False
            if decision.pays:
                self.run = MIN_RUN
        if not outcome.drafted and decision.doubling:  # a round without speculation decoded the doubling run
            self.run = min(MAX_RUN, self.run * 2)
        if self.adaptive and not draft_free and (decision.evaluated or decision.doubling):
            # (draft-target and EAGLE only: a draft-free proposer is consulted every round, so its runs are the
            # fallback of a round it had nothing for, and a long starting run would skip the copying it finds)
            self.costs.run_reached.add(self.run)
        drafted, accepted = outcome.drafted, outcome.accepted
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
            if accepted and t_dec is not None:
                self.costs.level(decision.load).gain.add(outcome.tokens * t_dec - outcome.target_s - outcome.draft_s)
        if drafted:
            fail = 1.0 if accepted < drafted else 0.0
            self.successes = self.successes * DECAY + accepted
            self.failures = self.failures * DECAY + fail
            self.prior_weight *= DECAY
            self.costs.acceptance.add(accepted / (accepted + fail) if accepted + fail else 1.0)
            t = self.costs.level(decision.load)
            t.target.setdefault(drafted + 1, _EW()).add(outcome.target_s)
            t.draft.setdefault(0 if draft_free else drafted, _EW()).add(outcome.draft_s)
        elif not self.adaptive:  # the fixed policy's one-token verification of nothing
            self.costs.level(decision.load).target.setdefault(1, _EW()).add(outcome.target_s)
        else:
            if outcome.tokens > 0:
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
