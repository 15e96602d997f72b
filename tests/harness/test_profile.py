"""records/profile.py: a request's rounds become the profile the BLS returns, and the bench's table of many requests
accounts for the client's measured time part by part (tests/e2e/test_profile.py runs it against a real server)."""

from __future__ import annotations

import pytest

from trt_spec.harness.report import profile_table
from trt_spec.in_triton.speculative_loop import Round
from trt_spec.records.profile import RequestProfile, loop_profile, summarize

ROUNDS = [
    Round(k=4, drafted=4, accepted=2, tokens=3, draft_s=0.001, target_s=0.012, call_s=0.010),  # the prefill
    Round(k=4, drafted=4, accepted=4, tokens=5, draft_s=0.001, target_s=0.006, call_s=0.005),
    Round(k=0, drafted=0, accepted=0, tokens=8, draft_s=0.0, target_s=0.020, call_s=0.019),
    Round(k=4, drafted=2, accepted=0, tokens=1, draft_s=0.001, target_s=0.004, call_s=0.004),
]


def test_rounds_become_calls_by_kind_and_tokens_submitted_and_the_rest_is_bookkeeping():
    p = loop_profile(ROUNDS, loop_s=0.050, stream_s=0.004)
    assert p.calls == {("prefill", 5): [1, 0.010], ("verify", 5): [1, 0.005], ("decode", 8): [1, 0.019],
                       ("verify", 3): [1, 0.004]}  # fmt: skip
    assert p.proposal_s == pytest.approx(0.003)
    assert p.loop_s == pytest.approx(0.050 - 0.003 - 0.038 - 0.004)  # engine inputs and policy: the loop's own
    again = RequestProfile.from_json(p.to_json())
    assert again.calls == p.calls and again.loop_s == pytest.approx(p.loop_s)
    assert RequestProfile.from_json([p.to_json().encode()]).calls == p.calls  # as gRPC returns the output


def test_the_table_accounts_for_the_measured_time_and_triton_gets_the_rest():
    p = loop_profile(ROUNDS, loop_s=0.050, stream_s=0.004)
    p.parse_s, p.finish_s = 0.002, 0.001
    p.bls_s = 0.053
    t = summarize([(p, 0.060), (p, 0.070)])
    parts = {x["part"]: x["seconds"] for x in t["parts"]}
    assert sum(parts.values()) == pytest.approx(0.130)
    assert parts["triton_s"] == pytest.approx(0.130 - 2 * 0.053)
    assert [(c["call"], c["tokens"]) for c in t["calls"]] == [
        ("prefill", 5),
        ("verify", 3),
        ("verify", 5),
        ("decode", 8),
    ]
    assert t["calls"][2]["count"] == 2 and t["calls"][2]["mean_s"] == pytest.approx(0.005)
    md = "\n".join(profile_table(t))
    assert "| Triton / gRPC (client time − BLS time) | 0.024 | 18.5% | 12.0 |" in md
    assert summarize([]) is None and profile_table(None) == []


def test_an_in_engine_request_is_one_engine_call():
    p = loop_profile([], loop_s=0.040, stream_s=0.005)
    assert p.calls == {("in-engine", 0): [1, pytest.approx(0.035)]} and p.loop_s == 0.0
