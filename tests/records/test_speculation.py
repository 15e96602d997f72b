"""Speculation's vocabulary and maths, defined once (trt_spec/records/speculation.py), and the places that must use them."""

import pytest

from trt_spec.records.speculation import (LOOP_MODES, Mode, acceptance_rate, break_even_acceptance, expected_tokens,
                                  leviathan_bound, mean_acceptance_length, solve_alpha)


def test_acceptance_definitions_are_vllms():
    assert mean_acceptance_length(accepted=30, speculative_rounds=10) == 4.0  # 1 + accepted / speculative rounds
    assert acceptance_rate(accepted=30, drafted=40) == 0.75
    assert acceptance_rate(0, 0) is None and mean_acceptance_length(0, 0) is None  # undefined, not 0


def test_expected_tokens_and_leviathan_bound_known_values():
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0 and expected_tokens(0.7, 0) == 1.0
    assert leviathan_bound(0.0, 4, 0.0) == pytest.approx(1.0)  # nothing accepted, free draft: no gain, no loss
    assert leviathan_bound(1.0, 4, 0.0) == pytest.approx(5.0)  # all accepted: k + 1 tokens per pass
    assert leviathan_bound(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert leviathan_bound(0.2, 4, 0.3) < 1.0  # a costly, rarely right draft makes decoding slower
    assert leviathan_bound(0.5, 0, 0.3) == 1.0
    # verification that costs r decode steps instead of 1 lowers the bound by exactly (k·c + 1) / (k·c + r)
    assert leviathan_bound(0.32, 1, 0.06, verify_cost=1.2) == pytest.approx(leviathan_bound(0.32, 1, 0.06) * 1.06 / 1.26)


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
    from trt_spec.records.config import SpecMode
    from typing import get_args

    assert set(get_args(SpecMode)) == {m.value for m in Mode}  # the config's choices are the modes


def test_the_bench_and_the_server_metrics_give_one_mean_acceptance_length():
    """`make demo` printed 3.63 and 2.87 under one name: the bench divided by the rounds that speculated, the
    Prometheus summary by all rounds. Both now call speculation.mean_acceptance_length over speculative rounds."""
    from trt_spec.harness.bench import Sample, acceptance_summary as bench_summary
    from trt_spec.in_triton.spec_metrics import acceptance_summary as server_summary, parse_metrics

    # one request: 4 rounds, one of them without speculation (k = 0), 6 of 9 drafted tokens accepted
    s = Sample("tensorrt_llm_bls", 0, 0, 10, 0.1, 1.0, 0.1, accepted=6, drafted=9, steps=4,
               histogram=[0, 1, 0, 2], draft_lengths=[3, 3, 0, 3])
    bench = bench_summary([s])
    exposition = "\n".join([
        'trt_spec_requests_total{model="tensorrt_llm_bls",mode="ngram"} 1',
        'trt_spec_draft_tokens_total{model="tensorrt_llm_bls",mode="ngram"} 9',
        'trt_spec_accepted_draft_tokens_total{model="tensorrt_llm_bls",mode="ngram"} 6',
        'trt_spec_rounds_total{model="tensorrt_llm_bls",mode="ngram"} 4',
        'trt_spec_rounds_without_speculation_total{model="tensorrt_llm_bls",mode="ngram"} 1'])
    server = server_summary(parse_metrics(exposition))
    assert bench["mean_acceptance_length"] == server["mean_acceptance_length"] == 1 + 6 / 3
