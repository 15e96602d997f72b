"""The draft-length policy (trt_spec/records/draft_policy.py) on synthetic costs: what it chooses and why."""

import math

import pytest

from trt_spec.records import draft_policy as dp
from trt_spec.records.draft_policy import CostModel, DraftLengthPolicy
from trt_spec.records.speculation import expected_tokens


def costs(verify=(0.050, 0.002), run=(0.004, 0.040), draft=None, rounds=20):
    """A cost model that has measured: verification a + b·n for n = 1..9, runs O + T·m for m = 1, 2, 4, 8 and
    (optionally) draft calls d0 + d1·k."""
    c = CostModel()
    t = c.level(1)
    for _ in range(rounds):
        for n in range(1, 10):
            t.target.setdefault(n, dp._EW()).add(verify[0] + verify[1] * n)
        for m in (1, 2, 4, 8):
            t.runs.setdefault(m, dp._EW()).add(run[0] + run[1] * m)
        if draft:
            for k in range(1, 9):
                t.draft.setdefault(k, dp._EW()).add(draft[0] + draft[1] * k)
    return c


def request(c, alpha, policy="adaptive", weight=50.0):
    """A request whose acceptance history says alpha (with the weight of many rounds)."""
    pol = DraftLengthPolicy(policy)
    pol.costs = c
    r = pol.start()
    r.successes, r.failures = alpha * weight, (1 - alpha) * weight
    return r


def test_cost_model_recovers_the_lines_it_measured():
    c = costs().at(1)
    a, b = c.verify_line()
    assert a == pytest.approx(0.050) and b == pytest.approx(0.002)
    assert c.verify_s(9) == pytest.approx(0.068)
    assert c.decode_s() == pytest.approx(0.040)  # the runs' slope: per-token cost without the call overhead
    assert c.call_overhead_s() == pytest.approx(0.004)
    assert c.draft_s(4) == 0.0  # nothing measured: a draft-free proposer costs nothing
    assert costs(draft=(0.001, 0.003)).at(1).draft_s(4) == pytest.approx(0.013)


def test_costs_are_kept_per_load_level():
    """Costs measured at one load decide at another only until that load has its own measurements."""
    c = costs()  # measured alone in the loop
    assert [dp.load_level(a) for a in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 3, 3, 4, 4, 5]
    assert c.at(8) is c.at(1)  # nothing measured at 5-8 yet: the nearest level's
    c.level(8).target.setdefault(5, dp._EW()).add(0.300)  # one verification with 8 in flight
    assert c.at(8).verify_s(5) == pytest.approx(0.300) and c.at(1).verify_s(5) == pytest.approx(0.060)
    assert c.at(16) is c.at(8) and c.at(2) is c.at(1)


def test_expected_tokens_is_leviathans_formula():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def k_of(r, cap=8, active=1, remaining=10_000):
    """The draft length a draft-target round would verify (0: a run without speculation)."""
    d = r.decide(cap, active, remaining, draft_free=False)
    return d.k if d.speculate else 0


def test_high_acceptance_drafts_long_low_acceptance_does_not_speculate():
    c = costs()
    assert k_of(request(c, 0.9)) == 8
    # alpha 0.2: E(k) <= 1/(1-0.2) = 1.25 tokens per >= 54 ms round, decoding gives 1 per 40 ms -> no speculation
    assert k_of(request(c, 0.2)) == 0
    # in between the best k is interior: alpha 0.6 with verification at 50 + 2n ms
    r = request(c, 0.6)
    best = max(range(1, 9), key=lambda k: expected_tokens(r.alpha, k) / (0.050 + 0.002 * (k + 1)))
    assert k_of(r) == best and 1 < best < 8


def test_load_shrinks_k_and_then_stops_speculation():
    """Costs are measured per load level: where batched verification grows steeply with the tokens submitted (a
    compute-bound batch), the same acceptance buys a shorter draft, and at a steep enough load none."""
    c = costs(verify=(0.050, 0.002))  # alone: verification nearly flat in n
    for level_active, slope in ((4, 0.012), (8, 0.040)):  # 3-4 and 5-8 in flight: each extra token costs more
        t = c.level(level_active)
        for _ in range(20):
            for n in range(1, 10):
                t.target.setdefault(n, dp._EW()).add(0.080 + slope * n)
            for m in (1, 2, 4, 8):
                t.runs.setdefault(m, dp._EW()).add(0.010 + 0.060 * m)
    ks = [k_of(request(c, 0.7), active=b) for b in (1, 4, 8)]
    assert ks[0] > ks[1] > ks[2] == 0, ks


def test_draft_cost_counts():
    cheap, dear = costs(draft=(0.001, 0.001)), costs(draft=(0.005, 0.030))
    assert k_of(request(cheap, 0.75)) > 0
    assert k_of(request(dear, 0.75)) == 0  # a draft token as dear as most of a target step


def test_nothing_measured_yet_speculates_at_the_cap():
    d = DraftLengthPolicy().start().decide(6, 1, 10, draft_free=False)
    assert d.k == 6 and d.speculate and d.pays and d.run_len == dp.MIN_RUN


def test_fixed_policy_is_the_old_behaviour():
    r = request(costs(), 0.1, policy="fixed")
    d = r.decide(5, 8, 50, draft_free=False)
    assert d.k == 5 and d.speculate and not d.evaluated  # whatever the acceptance or load
    assert r.confirm(r.decide(5, 8, 50, draft_free=True), 3, proposer_s=0.0).speculate
    assert r.decide(5, 8, 50, draft_free=True).run_len == 1  # nothing to verify: one target token


def test_the_first_round_decodes_one_token_when_it_does_not_speculate():
    r = request(costs(), 0.2)
    r.run = 8
    assert r.decide(8, 1, 100, draft_free=False, first=True).run_len == 1
    assert r.decide(8, 1, 100, draft_free=False).run_len == 8


def test_decisions_are_records_and_queries_change_nothing():
    """decide() and confirm() only read the policy; observe() alone learns. The same state decides the same way
    twice, and the record says why: the k, whether it pays, whether it is a probe, the run it would decode."""
    r = request(costs(), 0.2)
    before = dict(vars(r))
    a, b = r.decide(8, 1, 100, draft_free=False), r.decide(8, 1, 100, draft_free=False)
    assert a == b and vars(r) == before
    assert (a.k, a.speculate, a.pays, a.probe, a.evaluated, a.run_len, a.doubling, a.load) == (
        0,
        False,
        False,
        False,
        True,
        dp.MIN_RUN,
        True,
        1,
    )
    r.confirm(r.decide(8, 1, 100, draft_free=True), 5, proposer_s=0.0)
    assert vars(r) == before
    r.observe(a, dp.Outcome(drafted=0, accepted=0, tokens=a.run_len, draft_s=0.0, target_s=0.044), draft_free=False)
    assert r.probe and r.run == 2 * dp.MIN_RUN  # learned: probe next, and the next run is twice as long
    probe = r.decide(8, 1, 100, draft_free=False)
    assert probe.speculate and probe.probe and not probe.pays  # the record names the probe


def test_draft_target_runs_double_after_probes_that_lose_and_reset_when_speculation_pays():
    c = costs()
    r = request(c, 0.2)
    runs = []
    for _ in range(4):
        d = r.decide(8, 1, 10_000, draft_free=False)
        assert not d.speculate
        runs.append(d.run_len)
        r.observe(d, dp.Outcome(0, 0, d.run_len, 0.0, 0.004 + 0.04 * d.run_len), draft_free=False)
        d = r.decide(8, 1, 10_000, draft_free=False)  # the probe after a run speculates whatever the estimate says
        assert d.speculate and d.probe and d.k > 0
        r.observe(d, dp.Outcome(d.k, 0, 1, 0.001, 0.05), draft_free=False)  # ... and loses
    assert runs == [1, 2, 4, 8]
    r.successes, r.failures = 50.0, 1.0  # acceptance comes back
    d = r.decide(8, 1, 10_000, draft_free=False)
    assert d.speculate and d.pays
    r.observe(d, dp.Outcome(d.k, d.k, d.k + 1, 0.001, 0.06), draft_free=False)
    assert r.run == dp.MIN_RUN


def lose_probes(r, rounds: int) -> list[int]:
    """Runs without speculation, each followed by a probe that loses; the runs' lengths."""
    runs = []
    for _ in range(rounds):
        d = r.decide(8, 1, 10_000, draft_free=False)
        runs.append(d.run_len)
        r.observe(d, dp.Outcome(0, 0, d.run_len, 0.0, 0.004 + 0.04 * d.run_len), draft_free=False)
        d = r.decide(8, 1, 10_000, draft_free=False)
        r.observe(d, dp.Outcome(d.k, 0, 1, 0.001, 0.05), draft_free=False)
    return runs


def test_a_new_request_starts_from_the_run_the_deployment_reached_not_from_one():
    pol = DraftLengthPolicy("adaptive")
    pol.costs = costs()
    first = pol.start()
    first.successes, first.failures = 10.0, 40.0
    assert lose_probes(first, 7) == [1, 2, 4, 8, 16, 32, 64]
    second = pol.start()  # where probes keep losing, the next request skips most of the doubling ...
    second.successes, second.failures = 10.0, 40.0
    runs = lose_probes(second, 2)
    assert dp.MIN_RUN < runs[0] < dp.MAX_RUN and runs[1] == 2 * runs[0]
    for _ in range(60):  # ... and where speculation pays again, requests start from MIN_RUN again
        r = pol.start()
        r.successes, r.failures = 50.0, 1.0
        d = r.decide(8, 1, 10_000, draft_free=False)
        assert d.speculate and d.pays
        r.observe(d, dp.Outcome(d.k, d.k, d.k + 1, 0.001, 0.06), draft_free=False)
    assert pol.start().run == dp.MIN_RUN
    assert DraftLengthPolicy("adaptive").start().run == dp.MIN_RUN  # a fresh deployment: nothing reached yet


def test_draft_free_requests_always_start_their_runs_from_one():
    """A draft-free proposer is consulted every round: a run is what a round without a proposal decodes, and a new
    request starting from a long one would decode short requests whole before it could copy anything."""
    pol = DraftLengthPolicy("adaptive")
    for _ in range(10):
        r = pol.start()
        for _ in range(6):
            d = r.decide(8, 1, 10_000, draft_free=True)
            d = r.confirm(d, 0, 0.0)  # the proposer had nothing
            r.observe(d, dp.Outcome(0, 0, d.run_len, 0.0, 0.004 + 0.04 * d.run_len, empty=True), draft_free=True)
    assert pol.start().run == dp.MIN_RUN


def test_draft_free_run_length_is_the_square_root_rule():
    c = costs()
    r = request(c, 0.7)
    c.level(1).gain.add(0.060)  # a useful speculative round saved 60 ms
    r.useful, r.consulted = 1.0, 10.0  # about one consultation in 10 (with the deployment's prior) was useful
    c.useful.add(0.1)
    q = (1.0 + dp.PRIOR_ROUNDS * 0.1) / (10.0 + dp.PRIOR_ROUNDS)
    run = lambda remaining: r.decide(8, 1, remaining, draft_free=True).run_len  # noqa: E731
    assert run(10_000) == round(math.sqrt(2 * 0.004 / (q * 0.060)))
    r.useful = 0.0
    c.useful = dp._EW()
    c.useful.add(0.0)
    assert run(10_000) == dp.MAX_RUN  # nothing useful lately: the longest run
    assert run(3) == 3  # never past max_tokens


def test_draft_free_proposal_kept_only_when_verification_pays():
    c = costs()
    keep = lambda alpha: (lambda r: r.confirm(r.decide(6, 1, 100, draft_free=True), 6, 0.0002).speculate)(  # noqa
        request(c, alpha)
    )
    assert keep(0.9) and not keep(0.1)


def test_unknown_policy_is_one_line():
    with pytest.raises(ValueError, match="draft_len_policy 'greedy': use one of adaptive, fixed"):
        DraftLengthPolicy("greedy")
    with pytest.raises(ValueError, match="draft_len_policy 'x'"):
        DraftLengthPolicy().start("x")


def test_a_draft_that_is_never_accepted_drives_the_estimate_to_zero_not_to_the_priors_floor():
    """The deployment's acceptance starts a request's estimate and then ages like any other round: with a prior of 0.5
    that never decayed, a never-accepted draft's estimate stuck at 2·0.5/(5 + 2) = 0.14, where one draft token still
    "paid" at CPU-like costs (measured: an EAGLE head speculating k = 1 for 35 rounds with nothing accepted)."""
    r = DraftLengthPolicy("adaptive").start()
    assert r.alpha == 0.5
    for _ in range(20):
        r.observe(dp.Decision(k=1, run_len=1, speculate=True), dp.Outcome(1, 0, 1, 0.001, 0.05), draft_free=False)
    assert r.alpha < 0.01


# -- draft-free proposals with evidence: how much of a proposal to verify ----------------------------------------------
STRONG, WEAK = (12, 1, 1), (1, 1, 3)  # a long single-source copy; a one-token match that 1 of 3 occurrences backs


def flat_and_cpu():
    """Verification that costs one decode step whatever it verifies (a GPU at small batch), and this CPU's (a 9-token
    verification ≈ 2.3 decode steps: docs/measurements.md)."""
    t = 0.040
    return costs(verify=(t, 0.0), run=(0.0, t)), costs(verify=(t * (1 - 0.1625), t * 0.1625), run=(0.0, t))


def trained(c, rounds=400):
    """The deployment has verified many tokens of each kind: strong ones accepted ~95% of the time, weak ones ~10%."""
    for i in range(rounds):
        c.confidence.observe((STRONG,), int(i % 20 != 0))
        c.confidence.observe((WEAK,), int(i % 10 == 0))
    return c


def test_proposal_length_is_what_the_costs_pay_for():
    flat, cpu = (trained(c) for c in flat_and_cpu())
    assert flat.confidence.p(STRONG) == pytest.approx(0.95, abs=0.03)
    assert cpu.confidence.p(WEAK) == pytest.approx(0.1, abs=0.03)
    mixed = [STRONG] * 3 + [WEAK] * 5
    for policy in ("fixed", "adaptive"):
        on_flat, on_cpu = request(flat, 0.5, policy), request(cpu, 0.5, policy)
        # flat: every token that may be accepted is free to verify, however unlikely
        assert on_flat.proposal_len(mixed, 1) == 8 and on_flat.proposal_len([WEAK] * 8, 1) == 8
        # CPU (a token costs 0.16 of a step): the strong prefix pays for its share of the call, the weak tail does not
        assert on_cpu.proposal_len(mixed, 1) == 3 and on_cpu.proposal_len([WEAK] * 8, 1) == 0
        assert on_cpu.proposal_len([STRONG] * 8, 1) == 8
    assert DraftLengthPolicy("fixed").start().proposal_len([WEAK] * 8, 1) == 8  # nothing measured: all of it


def test_confidence_starts_from_the_occurrences_and_learns_from_acceptance():
    c = CostModel()
    assert c.confidence.p((1, 1, 1)) == pytest.approx(2 / 3) and c.confidence.p((5, 1, 3)) == pytest.approx(2 / 5)
    ev = ((4, 1, 1), (5, 1, 1), (6, 2, 2), (7, 1, 1))
    c.confidence.observe(ev, 1)  # token 1 accepted, token 2 rejected, tokens 3-4 never judged
    t = c.confidence.table
    assert {k: (e.s, e.w) for k, e in t.items()} == {(3, 1, True): (1.0, 1.0), (4, 1, True): (0.0, 1.0)}
    c.confidence.observe(((6, 2, 2),), 1)
    assert c.confidence.p((6, 2, 2)) == pytest.approx((1 + dp.PRIOR_ROUNDS * 3 / 4) / (1 + dp.PRIOR_ROUNDS))
    assert dp.evidence_key((40, 9, 9)) == (dp.MATCH_LEVELS, dp.AGREE_LEVELS, True)
    assert dp.evidence_key((3, 1, 2)) == (3, 1, False)


def test_confirm_verifies_the_paying_prefix_and_observe_learns_from_it():
    _, cpu = flat_and_cpu()
    trained(cpu)
    fixed = request(cpu, 0.5, "fixed")  # the control arm verifies the whole proposal, weak or not
    whole = fixed.confirm(fixed.decide(8, 1, 100, draft_free=True), 8, 0.0001, [WEAK] * 8)
    assert whole.speculate and whole.keep is None
    r = request(cpu, 0.5)
    d = r.confirm(r.decide(8, 1, 100, draft_free=True), 8, 0.0001, [STRONG] * 3 + [WEAK] * 5)
    assert d.speculate and d.keep == 3 and d.evidence == (STRONG,) * 3
    before = cpu.confidence.table[dp.evidence_key(STRONG)].w
    r.observe(d, dp.Outcome(3, 2, 3, 0.0001, 0.05), draft_free=True)
    d3 = dp.CONFIDENCE_DECAY
    assert cpu.confidence.table[dp.evidence_key(STRONG)].w == pytest.approx(before * d3**3 + d3**2 + d3 + 1)
    silent = r.confirm(r.decide(8, 1, 100, draft_free=True), 8, 0.0001, [WEAK] * 8)
    assert not silent.speculate and silent.keep == 0
    # adaptive: after a run the policy chose, the next weak proposal is probed with its first token
    a = request(cpu, 0.5)
    a.probe = True
    probe = a.confirm(a.decide(8, 1, 100, draft_free=True), 8, 0.0001, [WEAK] * 8)
    assert probe.speculate and probe.probe and probe.keep == 1 and not probe.pays


def test_the_first_round_measures_no_cost_its_call_also_read_the_prompt():
    for policy, drafted in (("fixed", 0), ("fixed", 4), ("adaptive", 0), ("adaptive", 4)):
        r = DraftLengthPolicy(policy).start()
        d = r.decide(8, 1, 100, draft_free=True, first=True)
        r.observe(d, dp.Outcome(drafted, drafted, drafted + 1, 0.0, 9.0, prefill=True), draft_free=True)
        t = r.costs.level(1)
        assert not t.target and not t.runs and not t.draft, policy
