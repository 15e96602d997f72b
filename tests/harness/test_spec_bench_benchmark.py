"""benchmarks/spec_bench.py without a server: which questions it picks per category, how it reads HF generate's rounds,
and its leaderboard table, goal checks and plot from synthetic results (the speedups are bench.summarize's)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

from trt_spec.harness.bench import RequestSample, summarize
from trt_spec.harness.prompts import Prompt
from trt_spec.records.names import BASELINE, SPECULATIVE

from .test_spec_bench import SPEC_BENCH, needs_spec_bench

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("spec_bench_script", ROOT / "benchmarks" / "spec_bench.py")
sb = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(sb)


def _prompts(counts: dict[str, int]) -> list[Prompt]:
    return [Prompt(f"{c} {i}", 8, f"{c}-{i}", c) for c, n in counts.items() for i in range(n)]


def test_selection_is_one_per_slice_seeded_and_round_robin():
    prompts = _prompts({"qa": 80, "rag": 80, "mt_bench": 5})
    a = sb.select_per_category(prompts, 4, seed=0)
    assert a == sb.select_per_category(prompts, 4, seed=0)  # deterministic
    assert [p.category for p in a[:3]] == ["qa", "rag", "mt_bench"]  # round-robin, file order of categories
    for c in ("qa", "rag"):
        idx = [int(p.id.split("-")[1]) for p in a if p.category == c]
        assert [i // 20 for i in idx] == [0, 1, 2, 3]  # one from each quarter of the category's rows
    assert sum(p.category == "mt_bench" for p in a) == 4
    others = [sb.select_per_category(prompts, 4, seed=s) for s in range(1, 6)]
    assert any(o != a for o in others)  # the seed decides the picks
    assert [p.id for p in sb.select_per_category(prompts, 10, 0, ["mt_bench"])] == [f"mt_bench-{i}" for i in range(5)]
    assert [p.category for p in sb.select_per_category(prompts, 1, 0, ["rag", "qa"])] == ["rag", "qa"]


@pytest.mark.parametrize(
    "limit,cats,msg", [(0, [], "--limit-per-category must be >= 1"), (1, ["math"], "--categories math: not in")]
)
def test_bad_selection_is_one_line(limit, cats, msg):
    with pytest.raises(ValueError, match=msg):
        sb.select_per_category(_prompts({"qa": 3}), limit, 0, cats)


@needs_spec_bench
def test_spec_bench_groups_mt_bench_as_the_leaderboard_does():
    prompts = sb.spec_bench_prompts(SPEC_BENCH, 32)
    counts = {c: sum(p.category == c for p in prompts) for c in dict.fromkeys(p.category for p in prompts)}
    assert counts == {c: 80 for c in sb.COLUMNS}
    assert all(p.max_tokens == 32 for p in prompts) and prompts[0].id == "81:writing"


def test_forward_rounds_reads_drafted_and_accepted_per_target_call():
    r = sb.ForwardRounds.__new__(sb.ForwardRounds)
    # prompt 10: prefill + 4 drafts (2 kept), 4 drafts (none kept), no drafts, 4 drafts (all kept): 20 tokens in all
    r.calls = [(0, 14), (12, 5), (13, 1), (14, 5)]
    assert r.rounds(10, 20) == [(4, 2), (4, 0), (0, 0), (4, 4)]
    assert r.rounds(10, 18) == [(4, 2), (4, 0), (0, 0), (4, 2)]  # the budget cut the last round


def test_forward_rounds_on_a_real_hf_prompt_lookup_generation():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(cfg).eval()
    rounds = sb.ForwardRounds(model)
    prompt = torch.tensor([[random.Random(0).randrange(3, 32) for _ in range(12)] * 3])
    with torch.inference_mode():
        plain = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
        rounds.calls.clear()
        out = model.generate(
            prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0, prompt_lookup_num_tokens=4
        )
    rs = rounds.rounds(prompt.shape[1], out.shape[1])
    assert torch.equal(out, plain)  # greedy: the same tokens
    assert sum(a + 1 for _, a in rs) == out.shape[1] - prompt.shape[1]  # every new token is one round's
    assert any(a for _, a in rs) and all(0 <= a <= d for d, a in rs)


def _result(speedups: dict[str, float]) -> dict:
    """A bench.summarize result: per category one pair whose baseline takes `speedup` x the speculative time."""
    samples = []
    for i, (c, s) in enumerate(speedups.items()):
        samples.append(RequestSample(BASELINE, i, 0, 16, 0.1, s, 0.05, category=c))
        samples.append(RequestSample(SPECULATIVE, i, 0, 16, 0.1, 1.0, 0.05, 9, 20, 10, [4, 3, 3], [2] * 10, category=c))
    res = summarize(samples, 2)
    res["k"] = 2
    res["cells"] = sb.cells(res)
    res["mean_over_categories"] = sb.mean_over_categories(res["cells"])
    return res


def _report(methods: dict) -> dict:
    cats = list(next(iter(methods.values()))["cells"])[:-1]
    return {
        "date": "2026-12-02T00:00:00+00:00",
        "machine": "test",
        "seed": 0,
        "max_tokens": 16,
        "categories": cats,
        "prompts_per_category": {c: 1 for c in cats},
        "left_out_too_long": [],
        "methods": methods,
    }


def test_cells_carry_summarize_speedups_and_the_mean_accepted_tokens():
    res = _result({"qa": 1.5, "rag": 1.0})
    assert res["cells"]["qa"]["speedup"] == pytest.approx(1.5) and res["cells"]["rag"]["speedup"] == pytest.approx(1.0)
    assert res["cells"][sb.OVERALL]["speedup"] == pytest.approx(2.5 / 2)
    assert res["cells"]["qa"]["mean_acceptance_length"] == pytest.approx(1 + 9 / 10)  # 1 + accepted / rounds
    assert res["mean_over_categories"] == pytest.approx(1.25)
    one = _result({"qa": 1.5})  # one category: bench lists no per-category row, the overall is its
    assert one["cells"]["qa"] == one["cells"][sb.OVERALL]


def test_goals_and_table_from_one_synthetic_run(tmp_path):
    rep = _report(
        {
            "ngram": _result({"qa": 1.6, "rag": 1.4}),
            "eagle": _result({"qa": 1.1, "rag": 0.96}),
            "hf-prompt-lookup": _result({"qa": 1.2, "rag": 1.2}),
        }
    )
    rep["goals"] = g = sb.goals(rep)
    assert [v for _, v, _ in g] == ["FAIL", "PASS", "PASS"]
    assert g[0][2] == "below: eagle rag 0.960x" and g[2][2] == "1.50x / 1.20x = 1.25"
    md = sb.markdown(rep)
    assert "| Method | Question Answering | Retrieval-aug. Generation | Overall | Mean of categories |" in md
    assert "| trt-spec n-gram (suffix) (k=2) | **1.60x** (1.60–1.60), τ 1.90 |" in md
    assert "| every category, every served mode >= 0.97x | **FAIL** |" in md
    sb.plot(rep, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_goals_not_measured_and_the_peer_ratio_fails_below_1_2():
    rep = _report({"ngram": _result({"qa": 1.4, "rag": 1.4}), "hf-prompt-lookup": _result({"qa": 1.3, "rag": 1.3})})
    assert [v for _, v, _ in sb.goals(rep)] == ["PASS", "PASS", "FAIL"]
    hf_only = _report({"hf-assisted": _result({"qa": 0.5, "rag": 0.5})})
    assert [v for _, v, _ in sb.goals(hf_only)] == ["NOT MEASURED"] * 3  # HF's own losses are no served mode's
