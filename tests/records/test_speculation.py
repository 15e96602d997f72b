"""Speculation's vocabulary and maths, defined once (trt_spec/records/speculation.py), and the places that must use
them."""

import json

import pytest

from trt_spec.records.speculation import (
    LOOP_MODES,
    Mode,
    acceptance_rate,
    break_even_acceptance,
    expected_tokens,
    leviathan_bound,
    mean_acceptance_length,
    solve_alpha,
)


def test_acceptance_definitions_are_vllms():
    assert mean_acceptance_length(accepted=30, speculative_rounds=10) == 4.0  # 1 + accepted / speculative rounds
    assert acceptance_rate(accepted=30, drafted=40) == 0.75
    assert acceptance_rate(0, 0) is None and mean_acceptance_length(0, 0) is None  # undefined, not 0


def test_expected_tokens_and_leviathan_bound_known_values():
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0 and expected_tokens(0.7, 0) == 1.0
    assert leviathan_bound(0.0, 4, 0.0) == pytest.approx(1.0)  # nothing accepted, free draft: no gain, no loss
    assert leviathan_bound(1.0, 4, 0.0) == pytest.approx(5.0)  # all accepted: k + 1 tokens per pass
    assert leviathan_bound(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    assert leviathan_bound(0.2, 4, 0.3) < 1.0  # a costly, rarely right draft makes decoding slower
    assert leviathan_bound(0.5, 0, 0.3) == 1.0
    # verification that costs r decode steps instead of 1 lowers the bound by exactly (k·c + 1) / (k·c + r)
    assert leviathan_bound(0.32, 1, 0.06, verify_cost=1.2) == pytest.approx(
        leviathan_bound(0.32, 1, 0.06) * 1.06 / 1.26
    )


def test_solve_alpha_inverts_expected_tokens():
    for alpha in (0.1, 0.5, 0.9):
        assert solve_alpha(expected_tokens(alpha, 4), 4) == pytest.approx(alpha, abs=1e-6)
    assert solve_alpha(1.0, 4) == 0.0 and solve_alpha(5.0, 4) == 1.0


def test_break_even_acceptance_is_where_speculation_stops_paying():
    # k=4, c=0.1, r=1.3: a* = 0.1 + 0.3/4 = 0.175; at a*, tokens per round (1 + 4a*) equal the round's cost (4c + r)
    a = break_even_acceptance(4, 0.1, 1.3)
    assert a == pytest.approx(0.175)
    assert 1 + 4 * a == pytest.approx(4 * 0.1 + 1.3)
    assert break_even_acceptance(8, 0.0, 1.0) == 0.0  # a free draft on a GPU pays at any acceptance
    with pytest.raises(ValueError, match="k must be >= 1"):
        break_even_acceptance(0, 0.1)


def test_modes_know_what_they_are():
    assert LOOP_MODES == ("draft_target", "ngram")
    assert [m.value for m in Mode if m.in_engine] == ["medusa", "eagle", "lookahead", "eagle3", "mtp"]
    assert [m.value for m in Mode if m.llmapi_only] == ["eagle3", "mtp"]  # runtime: llmapi only
    assert [m.value for m in Mode if m.engine_only] == ["medusa", "eagle", "lookahead"]  # trtllm-build only
    assert Mode.EAGLE3.trtllm_name is None and Mode.MTP.draft_free
    assert not Mode.DRAFT_TARGET.draft_free and Mode.NGRAM.draft_free and not Mode.NONE.draft_free
    assert Mode.NGRAM.trtllm_name == "draft_tokens_external" and Mode.LOOKAHEAD.trtllm_name == "lookahead_decoding"
    assert Mode.NONE.trtllm_name is None and Mode.MEDUSA.bls_mode == "engine" and Mode.NGRAM.bls_mode == "ngram"
    from trt_spec.records.config import Speculative

    assert Speculative.model_fields["mode"].annotation is Mode  # the config's choices are the modes, no parallel list
    assert Speculative(mode="ngram").mode is Mode.NGRAM and Mode.NGRAM == "ngram" and f"{Mode.NGRAM}" == "ngram"
    assert json.dumps({"mode": Mode.EAGLE3}) == '{"mode": "eagle3"}'


def test_one_policy_vocabulary_for_the_loop_and_the_eagle_chain():
    """Both loops take the same words (records/draft_policy.py decides for both); an unknown word is one line."""
    from trt_spec.records.speculation import LOOP_POLICIES, POLICIES, PROPOSERS, Policy, engine_policy

    assert POLICIES == ("adaptive", "fixed") and PROPOSERS == ("suffix", "prompt_lookup")
    assert set(LOOP_POLICIES) == set(Policy)
    assert engine_policy("adaptive") is Policy.ADAPTIVE and engine_policy("fixed") is Policy.FIXED
    for word in ("tree", "confidence"):  # "confidence": a word no release ever shipped, not read as another
        with pytest.raises(ValueError, match=rf"^eagle_draft_policy '{word}': use one of adaptive, fixed$"):
            engine_policy(word)


def test_the_bench_and_the_server_metrics_give_one_acceptance_summary():
    """`make demo` printed 3.63 and 2.87 under one name: the bench divided by the rounds that speculated, the
    Prometheus summary by all rounds. Both now fill speculation.AcceptanceCounts for the one
    speculation.acceptance_summary: the same request gives the same summary, key for key."""
    from trt_spec.harness.bench import RequestSample, request_acceptance_counts
    from trt_spec.in_triton.spec_metrics import parse_metrics, scraped_acceptance
    from trt_spec.records.speculation import acceptance_summary

    # one request: 4 rounds, one of them without speculation (k = 0), 6 of 9 drafted tokens accepted
    s = RequestSample(
        "tensorrt_llm_bls",
        0,
        0,
        10,
        0.1,
        1.0,
        0.1,
        accepted=6,
        drafted=9,
        steps=4,
        histogram=[0, 1, 1, 1],
        draft_lengths=[3, 3, 0, 3],
    )
    bench = acceptance_summary(request_acceptance_counts([s]))
    labels = 'model="tensorrt_llm_bls",mode="ngram"'

    def buckets(name: str, cumulative: list[int]) -> list[str]:
        les = [*enumerate(cumulative), ("+Inf", cumulative[-1])]
        return [f'{name}_bucket{{{labels},le="{le}"}} {n}' for le, n in les]

    exposition = "\n".join(
        [
            f"trt_spec_requests_total{{{labels}}} 1",
            f"trt_spec_draft_tokens_total{{{labels}}} 9",
            f"trt_spec_accepted_draft_tokens_total{{{labels}}} 6",
            f"trt_spec_rounds_total{{{labels}}} 4",
            f"trt_spec_rounds_without_speculation_total{{{labels}}} 1",
            *buckets("trt_spec_accepted_length", [0, 1, 2, 3]),
            *buckets("trt_spec_draft_length", [1, 1, 1, 4]),
        ]
    )
    server = scraped_acceptance(parse_metrics(exposition))
    assert bench["mean_acceptance_length"] == server["mean_acceptance_length"] == 1 + 6 / 3
    assert {k: v for k, v in server.items() if k not in ("rounds", "no_speculation_share")} == bench
    assert bench["per_position_acceptance"] == [1.0, 2 / 3, 1 / 3] and bench["draft_length_counts"] == [1, 0, 0, 3]
    assert bench["rounds_without_speculation_share"] == server["no_speculation_share"] == 0.25


# -- the one speedup definition (speculation.paired_speedup), used by every bench mode --------------------------------
def test_paired_speedup_is_the_ratio_of_summed_times_with_a_paired_interval():
    from trt_spec.records.speculation import Speedup, paired_speedup

    base, spec = [2.0, 4.0, 1.0], [1.0, 1.0, 2.0]
    s = paired_speedup(base, spec)
    assert isinstance(s, Speedup) and s.point == 7.0 / 4.0  # a ratio of sums, not the mean of 2, 4, 0.5
    assert s.low <= s.point <= s.high and paired_speedup(base, spec) == s  # seeded: the same timings, the same interval
    same = paired_speedup([1.5] * 5, [1.0] * 5)
    assert (same.point, same.low, same.high) == (1.5, 1.5, 1.5)  # no spread between pairs: no width
    for b, sp in (([1.0], []), ([], [])):
        with pytest.raises(ValueError, match="as many baseline as speculative timings"):
            paired_speedup(b, sp)


def test_every_bench_mode_reports_the_one_speedup():
    """The served bench (and so the OpenAI bench and tune, which summarize through it) and the in-process bench report
    paired_speedup. The in-process bench's was (spec tokens/s) / (baseline tokens/s): a second formula, which differs
    where the two sides' outputs differ in length (here 10 vs 5 tokens per prompt: it said 0.83x, not 1.67x)."""
    from trt_spec.harness.bench import RequestSample, summarize
    from trt_spec.harness.inprocess import BaselineRun, Pair, SpecRun, _row
    from trt_spec.in_triton.speculative_loop import LoopStats, Round
    from trt_spec.records.speculation import paired_speedup

    timings = [(2.0, 1.0), (3.0, 2.0)]  # (baseline, speculative) seconds per prompt
    expected = paired_speedup([b for b, _ in timings], [s for _, s in timings])
    served = summarize(
        [
            RequestSample(model, i, 0, 20, 0.1, t, 0.1)
            for i, pair in enumerate(timings)
            for model, t in zip(("ensemble", "tensorrt_llm_bls"), pair)
        ],
        4,
    )
    assert (served["speedup"], *served["speedup_ci95"]) == expected

    stats = LoopStats(drafted=4, accepted=2, steps=2, hist=[0, 0, 1], rounds=[Round(2, 2, 1, 2, 0.01, 0.1)] * 2)
    pairs = [
        Pair(i, 0, BaselineRun(list(range(10)), b, b * 0.9), SpecRun(list(range(5)), s, s * 0.9, stats), "", i)
        for i, (b, s) in enumerate(timings)
    ]
    row = _row(2, "fixed", pairs)
    assert (row["speedup"], *row["speedup_ci95"]) == expected
    assert row["spec_tok_s"] / row["baseline_tok_s"] == pytest.approx((10 / 3) / (20 / 5))  # the old formula's
    assert row["speedup"] == 5 / 3
