"""Metric math on synthetic samples: acceptance length, Leviathan bound, bootstrap interval, TPOT vs ITL,
chi-square, prompt files."""

import json
import random

import pytest

from trt_spec.harness.bench import RequestSample, request_acceptance_counts, summarize
from trt_spec.harness.identity import chi2_homogeneity, chi2_sf, first_divergence
from trt_spec.harness.metrics import low_acceptance_advice, tpot
from trt_spec.harness.prompts import PROMPT_SETS, load_prompts
from trt_spec.records.speculation import acceptance_summary, paired_speedup


def test_tpot_is_not_itl():
    # 11 tokens, first after 0.5 s, done at 1.5 s: TPOT = 1.0 / 10 regardless of how bursty chunks were
    assert tpot(1.5, 0.5, 11) == pytest.approx(0.1)
    assert tpot(1.0, 1.0, 1) is None


def test_bootstrap_ci_covers_and_narrows():
    rng = random.Random(3)
    base = [1.0 + rng.random() * 0.2 for _ in range(40)]
    spec = [b / 2.0 * (1 + rng.uniform(-0.05, 0.05)) for b in base]
    point, lo, hi = paired_speedup(base, spec)
    assert lo < point < hi and lo < 2.0 < hi + 0.1 and hi - lo < 0.2
    with pytest.raises(ValueError, match="as many baseline as speculative timings"):
        paired_speedup([1.0], [])


def test_histogram_summary_and_per_position():
    s = [
        RequestSample(
            "tensorrt_llm_bls", 0, 0, 10, 0.1, 1.0, 0.1, accepted=6, drafted=12, steps=4, histogram=[1, 1, 1, 1]
        ),
        RequestSample(
            "tensorrt_llm_bls", 1, 0, 10, 0.1, 1.0, 0.1, accepted=0, drafted=6, steps=2, histogram=[2, 0, 0, 0]
        ),
    ]
    a = acceptance_summary(request_acceptance_counts(s))
    assert a["histogram"] == [3, 1, 1, 1] and a["steps"] == 6 and a["requests"] == 2
    assert a["acceptance_rate"] == pytest.approx(6 / 18) and a["mean_acceptance_length"] == pytest.approx(2.0)
    assert a["per_position_acceptance"] == pytest.approx([3 / 6, 2 / 6, 1 / 6])


def test_summarize_pairs_and_warns():
    samples = []
    for i in range(6):
        samples.append(RequestSample("ensemble", i, 0, 20, 0.1, 2.0, 0.1))
        samples.append(
            RequestSample(
                "tensorrt_llm_bls",
                i,
                0,
                20,
                0.1,
                2.5,
                0.12,
                accepted=1,
                drafted=20,
                steps=19,
                histogram=[18, 1, 0, 0, 0],
            )
        )
    out = summarize(samples, 4)
    assert out["speedup"] == pytest.approx(0.8)
    assert "SLOWER" in out["warning"] and "Advice" in out["warning"]
    # the served bench measures no draft cost: it says so instead of a bound computed from c = 0
    assert "draft/target cost unknown" in out["warning"] and "c=0.00" not in out["warning"]
    assert "Leviathan bound" not in out["warning"]
    assert low_acceptance_advice(0.8, 4, 0.05, 2.5) is None


def test_advice_fits_the_case():
    at_k1 = low_acceptance_advice(0.13, 1, 0.07, 0.92)  # already at k=1: lowering k is no advice
    assert "SLOWER" in at_k1 and "lower num_draft_tokens" not in at_k1 and "disable speculation" in at_k1
    assert "cannot beat the baseline" not in at_k1  # bound 1.06x: a better implementation could still win
    at_k4 = low_acceptance_advice(0.13, 4, 0.06, 0.69)  # bound 0.92x: no implementation wins
    assert "lower num_draft_tokens (k=4)" in at_k4 and "cannot beat the baseline" in at_k4


def test_chi_square():
    assert chi2_sf(3.84, 1) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(11.07, 5) == pytest.approx(0.05, abs=1e-3)
    assert chi2_sf(0.0, 3) == 1.0
    rng = random.Random(0)
    a = [rng.choice("abcd") for _ in range(2000)]
    b = [rng.choice("abcd") for _ in range(2000)]
    assert chi2_homogeneity(a, b)[2] > 0.001
    c = [rng.choices("abcd", weights=[0.4, 0.2, 0.2, 0.2])[0] for _ in range(2000)]
    assert chi2_homogeneity(a, c)[2] < 0.001


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_prompt_sets_and_jsonl(tmp_path):
    assert set(PROMPT_SETS) == {"code-edit", "code", "chat", "summarization", "agentic"}
    assert all(len(v) >= 4 for v in PROMPT_SETS.values())
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi", "max_tokens": 5}) + "\n\n" + json.dumps({"prompt": "yo"}) + "\n")
    ps = load_prompts(str(f))
    assert [(p.text, p.max_tokens) for p in ps] == [("hi", 5), ("yo", 128)]
    f.write_text('{"text": "x", "output_length": 3}\n')  # AIPerf's single_turn fields
    assert [(p.text, p.max_tokens) for p in load_prompts(str(f))] == [("x", 3)]
    f.write_text('{"query": "x"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:1: expected a JSON object with a \"prompt\" key"):
        load_prompts(str(f))
    g = tmp_path / "sharegpt.json"  # ShareGPT: the first human turn, max_tokens from the answer's length
    g.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [{"from": "human", "value": "Write a poem."}, {"from": "gpt", "value": "x" * 80}],
                },
                {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "Hi"}]},
            ]
        )
    )
    assert [(p.text, p.max_tokens, p.id) for p in load_prompts(str(g))] == [
        ("Write a poem.", 20, "a"),
        ("Hi", 128, "1"),
    ]
    g.write_text('[{"turns": []}]')
    with pytest.raises(ValueError, match='entry 0 has no "conversations" list'):
        load_prompts(str(g))
    with pytest.raises(ValueError, match="not one of code-edit"):
        load_prompts("nope")
    assert all(p.max_tokens == 7 for p in load_prompts("chat", 7))
