"""`trt-spec bench in-process CONFIG --format json`: the served speculative loop over in-process engines, on tiny
reference builds (through the CLI). That it reports what the served bench reports, round for round, is
tests/e2e/test_harness.py's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trt_spec.records.speculation import leviathan_bound  # noqa: E402

from ..farm import cli_in_process  # noqa: E402

CONTRACT = (
    "speedup",
    "token_identity",
    "acceptance_rate",
    "mean_acceptance_length",
    "cost_ratio",
    "leviathan_bound",
    "efficiency",
    "baseline_tok_s",
    "spec_tok_s",
)


@pytest.fixture(scope="module")
def configs(farm):
    """The farm's builds: draft-target with the target as its draft, with another random draft, and n-gram."""
    return {"copy": farm.config("dtm_copy"), "other": farm.config("dtm_fixed"), "ngram": farm.config("ngram")}


def bench(config, *args):
    """`trt-spec bench in-process CONFIG --format json ...`, in this process (the CLI's own code)."""
    p = cli_in_process(
        "bench", "in-process", str(config), "--format", "json", "--prompts", "code-edit", "--limit", "2",
        "--max-tokens", "24", "--ignore-eos", "--threads", "1", *args,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_json_contract_and_a_perfect_draft(configs):
    rep = bench(configs["copy"], "--k", "1", "--k", "4", "--policy", "fixed")
    for key in CONTRACT + ("verify_cost", "adjusted_bound", "adjusted_efficiency", "alpha", "k", "sweep"):
        assert key in rep, key
    assert [r["k"] for r in rep["sweep"]] == [1, 4]
    for r in rep["sweep"]:
        k = r["k"]
        assert r["token_identity"] == 1.0
        assert r["acceptance_rate"] == 1.0  # the draft is the target: all accepted
        assert r["alpha"] > 0.85  # from the mean length, which the budget-clamped last step lowers
        # 24 tokens: 1 from prefill, then steps of k + 1 (the last step clamped to the budget)
        # trt_spec.records.speculation's definition: the step left with nothing to draft is not averaged in
        assert r["mean_acceptance_length"] == pytest.approx(1 + r["accepted"] / r["speculative_rounds"])
        assert 0 < r["speculative_rounds"] <= r["steps"]
        assert r["accepted_histogram"][k] >= r["steps"] - 2
        assert r["leviathan_bound"] == pytest.approx(leviathan_bound(r["alpha"], k, r["cost_ratio"]))
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["leviathan_bound"])
        assert r["adjusted_bound"] == pytest.approx(leviathan_bound(r["alpha"], k, r["cost_ratio"], r["verify_cost"]))
        # timings of a tiny model on a shared CPU are noisy: only the order of magnitude is asserted
        assert 0.3 < r["verify_cost"] < 10 and 0.3 < r["cost_ratio"] < 10  # the draft costs what the target does
        assert r["baseline_tokens"] == r["spec_tokens"] == 2 * 24
        # the policy's per-round k, summarized as the served bench does: fixed k, clamped only by the budget
        a = r["acceptance"]
        assert r["draft_len_policy"] == "fixed" and a["rounds_without_speculation_share"] == 0.0
        assert sum(a["draft_length_counts"]) == r["steps"] and a["draft_length_counts"][k] >= r["steps"] - 2


def test_the_adaptive_policy_is_the_one_served(configs):
    """No --policy: the deployment's (adaptive), deciding per round as the BLS does; on a draft that is always right
    it speculates, and every round's choice is counted."""
    rep = bench(configs["copy"], "--k", "4")
    r = rep["sweep"][0]
    a = r["acceptance"]
    assert r["draft_len_policy"] == "adaptive" and r["token_identity"] == 1.0
    assert sum(a["draft_length_counts"]) == r["steps"] == len([x for s in r["samples"] for x in s["draft_lengths"]])
    assert a["drafted"] > 0 and r["acceptance_rate"] == 1.0


def test_a_wrong_draft_is_reported_as_slower(configs):
    rep = bench(configs["other"], "--k", "4", "--policy", "fixed", "--profile")
    assert rep["token_identity"] == 1.0  # output is still the target's
    assert rep["acceptance_rate"] < 0.3
    assert rep["leviathan_bound"] < 1.0  # an equally expensive, mostly wrong draft cannot pay
    # k draft passes + a verification for about one token each step: measured ~0.2x, far beyond timing noise
    assert rep["speedup"] < 1.0
    w = rep["warning"]
    assert w.startswith(
        f"speculative decoding is SLOWER than the baseline here ({rep['speedup']:.2f}x); "
        f"acceptance α={rep['alpha']:.2f} at k=4"
    )
    assert "even a perfectly efficient implementation cannot beat the baseline" in w
    assert "lower num_draft_tokens (k=4)" in w
    # --profile says where: 4 draft passes a round (about 1.35x the target's calls here) besides 1 verification
    prof = rep["sweep"][0]["profile"]
    parts = {p["part"]: p["seconds"] for p in prof["parts"]}
    assert sum(parts.values()) == pytest.approx(prof["request_s"])
    assert parts["proposal_s"] > 0.5 * parts["target_s"] and parts["proposal_s"] > 5 * parts["loop_s"]
    assert parts["triton_s"] == pytest.approx(0, abs=1e-9)  # no server in process
    calls = {kind: sum(c["count"] for c in prof["calls"] if c["call"] == kind) for kind in ("prefill", "verify")}
    # every step accounted for: a prefill and a verification are one each, a decode run one per token it produced
    decoded = sum(c["count"] * c["tokens"] for c in prof["calls"] if c["call"] == "decode")
    assert prof["requests"] == calls["prefill"] == 2 and calls["prefill"] + calls["verify"] + decoded == rep["steps"]


def test_ngram_and_a_k_beyond_the_build_is_one_clear_error(configs):
    rep = bench(configs["ngram"], "--k", "2")
    assert rep["mode"] == "ngram" and rep["token_identity"] == 1.0
    p = cli_in_process("bench", "in-process", str(configs["copy"]), "--k", "9", "--limit", "1")
    assert p.returncode != 0
    assert "max_draft_len" in p.stderr and "Traceback" not in p.stderr


def test_spec_bench_rows_filtered_by_category_get_the_per_category_table(configs, tmp_path):
    """A Spec-Bench-shaped file, --category twice: the rows of those two categories, a table row each whose speedup is
    paired_speedup over that category's pairs, in the JSON and the text report."""
    from trt_spec.harness.inprocess import format_report
    from trt_spec.records.speculation import paired_speedup

    f = tmp_path / "question.jsonl"
    rows = [(1, "writing", "def add(a, b):"), (2, "qa", "The quick brown fox"), (3, "rag", "for i in range(10):")]
    f.write_text(
        "".join(json.dumps({"question_id": i, "category": c, "turns": [t, "again"]}) + "\n" for i, c, t in rows)
    )
    rep = bench(
        configs["copy"],
        "--k",
        "2",
        "--policy",
        "fixed",
        "--prompts",
        str(f),
        "--category",
        "rag",
        "--category",
        "writing",
    )
    r = rep["sweep"][0]
    assert rep["prompts"] == 2 and [(s["prompt"], s["category"]) for s in r["samples"]] == [
        ("1", "writing"),
        ("3", "rag"),
    ]
    assert [(c["category"], c["prompts"], c["requests"]) for c in r["categories"]] == [("writing", 1, 1), ("rag", 1, 1)]
    for c, s in zip(r["categories"], r["samples"]):
        assert c["speedup"] == pytest.approx(paired_speedup([s["baseline_s"]], [s["spec_s"]]).point)
        assert c["acceptance_rate"] == 1.0 and c["rounds_without_speculation_share"] == 0.0  # the draft is the target
    text = format_report(rep)
    assert "per category, k=2 fixed:" in text
    assert [ln.split()[:2] for ln in text.splitlines() if ln.startswith("  writing") or ln.startswith("  rag")] == [
        ["writing", "1"],
        ["rag", "1"],
    ]
