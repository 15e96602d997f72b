"""Spec-Bench's questions as prompts (first turn, category kept), --category, and the per-category table every bench
report carries: its numbers are bench.per_category's, checked here against the same figures computed by hand.

The dataset is never copied into the repository: the shared file is read where it lies (TRT_SPEC_SPEC_BENCH names
another copy), and the tests that need it skip without it; the rest build tiny Spec-Bench-shaped files."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.cli import main
from trt_spec.harness.bench import RequestSample, per_category, summarize
from trt_spec.harness.prompts import DEFAULT_MAX_TOKENS, load_prompts, select_prompts
from trt_spec.harness.report import markdown
from trt_spec.records.names import BASELINE, SPECULATIVE
from trt_spec.records.speculation import paired_speedup

ROOT = Path(__file__).resolve().parents[2]
SPEC_BENCH = Path(
    os.environ.get("TRT_SPEC_SPEC_BENCH", ROOT.parent / "shared" / "datasets" / "spec_bench" / "question.jsonl")
)
needs_spec_bench = pytest.mark.skipif(
    not SPEC_BENCH.is_file(),
    reason=f"Spec-Bench's question.jsonl is not at {SPEC_BENCH} (hemingkx/Spec-Bench, data/spec_bench/question.jsonl; "
    "set TRT_SPEC_SPEC_BENCH to its path)",
)
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_ONLY = ("translation", "summarization", "qa", "math_reasoning", "rag")


def _rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_spec_bench
def test_spec_bench_loads_its_first_turns_with_ids_and_categories():
    rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
    prompts = load_prompts(str(SPEC_BENCH))
    assert len(prompts) == len(rows) == 480
    assert [(p.id, p.category, p.text) for p in prompts] == [
        (str(r["question_id"]), r["category"], r["turns"][0]) for r in rows
    ]
    assert len({p.id for p in prompts}) == 480 and all(p.max_tokens == DEFAULT_MAX_TOKENS for p in prompts)
    counts = Counter(p.category for p in prompts)
    assert set(counts) == set(MT_BENCH + SPEC_BENCH_ONLY) and len(counts) == 13
    assert all(counts[c] == 10 for c in MT_BENCH) and all(counts[c] == 80 for c in SPEC_BENCH_ONLY)
    assert sum(len(r["turns"]) > 1 for r in rows) == 80  # MT-Bench's second turns: not read (first turn only)
    assert {p.max_tokens for p in load_prompts(str(SPEC_BENCH), 32)} == {32}
    rag = select_prompts(prompts, ["rag", "writing"])
    assert [p.category for p in rag] == [p.category for p in prompts if p.category in ("rag", "writing")]
    assert len(rag) == 90


@pytest.mark.parametrize(
    "turns",
    [[], "Write a poem.", [""], ["ok", 3], None],
    ids=["empty", "a string", "an empty turn", "not a string", "null"],
)
def test_a_malformed_spec_bench_row_is_one_line_naming_file_and_line(tmp_path, turns):
    f = _rows(
        tmp_path / "q.jsonl",
        [{"question_id": 1, "category": "qa", "turns": ["fine"]}, {"question_id": 2, "category": "qa", "turns": turns}],
    )
    with pytest.raises(ValueError) as e:
        load_prompts(str(f))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}:2: ") and '"turns" must be a non-empty list' in msg


def test_categories_of_every_kind_of_prompt_and_the_filter(tmp_path):
    assert {p.category for p in load_prompts("chat")} == {"chat"}  # a shipped set's category is its name
    plain = _rows(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    assert [p.category for p in load_prompts(str(plain))] == [""]
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Hi"}]}]))
    assert [p.category for p in load_prompts(str(sharegpt))] == [""]
    f = _rows(
        tmp_path / "q.jsonl",
        [
            {"question_id": 7, "category": "qa", "turns": ["Q1", "Q1 follow-up"]},
            {"question_id": 8, "category": "rag", "turns": ["R1"]},
            {"question_id": 9, "category": "qa", "turns": ["Q2"]},
        ],
    )
    ps = load_prompts(str(f))
    assert [(p.id, p.category, p.text) for p in select_prompts(ps, ["qa"])] == [("7", "qa", "Q1"), ("9", "qa", "Q2")]
    assert select_prompts(ps, []) == ps
    with pytest.raises(ValueError, match=r"^--category math: no such category in these prompts; they have: qa, rag$"):
        select_prompts(ps, ["qa", "math"])
    with pytest.raises(ValueError, match="they have: none"):
        select_prompts(load_prompts(str(plain)), ["qa"])


@pytest.mark.parametrize(
    "cmd",
    [
        ("check",),
        ("tune",),
        ("bench", "served", "--url", "127.0.0.1:1"),
        ("bench", "openai", "--url", "http://127.0.0.1:1"),
        ("bench", "in-process", "none.yaml"),
    ],
)
def test_an_unknown_category_is_one_line_before_anything_runs(cmd, tmp_path):
    f = _rows(tmp_path / "q.jsonl", [{"question_id": 1, "category": "qa", "turns": ["Q"]}])
    r = CliRunner().invoke(main, [*cmd, "--prompts", str(f), "--category", "rag"], catch_exceptions=False)
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: --category rag: no such category in these prompts; they have: qa"
    ], r.output


def _two_categories() -> list[RequestSample]:
    """qa: prompts 0 and 1 (k chosen per round known, one round without speculation); rag: prompt 2, twice."""
    out = []
    for i, r, cat, b_lat, s_lat, acc, drafted, hist, ks in (
        (0, 0, "qa", 2.0, 1.0, 6, 8, [0, 2, 2], [2, 2, 2, 2, 0]),
        (1, 0, "qa", 3.0, 2.5, 1, 8, [3, 1, 0], [2, 2, 2, 2]),
        (2, 0, "rag", 4.0, 1.0, 8, 8, [0, 0, 4], [2, 2, 2, 2]),
        (2, 1, "rag", 4.2, 1.4, 7, 8, [0, 1, 3], [2, 2, 2, 2]),
    ):
        out.append(RequestSample(BASELINE, i, r, 20, 0.1, b_lat, 0.1, category=cat))
        steps = len(ks)
        out.append(RequestSample(SPECULATIVE, i, r, 20, 0.1, s_lat, 0.05, acc, drafted, steps, hist, ks, category=cat))
    return out


def test_the_per_category_table_is_the_overall_definitions_per_category(tmp_path):
    samples = _two_categories()
    rows = per_category(samples)
    assert [(r["category"], r["prompts"], r["requests"]) for r in rows] == [("qa", 2, 2), ("rag", 1, 2)]
    qa, rag = rows
    # by hand: Σ baseline / Σ speculative seconds, the interval paired_speedup's over the category's pairs
    assert qa["speedup"] == pytest.approx(5.0 / 3.5) and rag["speedup"] == pytest.approx(8.2 / 2.4)
    assert qa["speedup_ci95"] == list(paired_speedup([2.0, 3.0], [1.0, 2.5])[1:])
    assert rag["speedup_ci95"] == list(paired_speedup([4.0, 4.2], [1.0, 1.4])[1:])
    # acceptance: accepted / drafted; 1 + accepted / rounds that verified drafts; rounds with k = 0 / all rounds
    assert qa["acceptance_rate"] == pytest.approx(7 / 16) and rag["acceptance_rate"] == pytest.approx(15 / 16)
    assert qa["mean_acceptance_length"] == pytest.approx(1 + 7 / 8)
    assert rag["mean_acceptance_length"] == pytest.approx(1 + 15 / 8)
    assert qa["rounds_without_speculation_share"] == pytest.approx(1 / 9)
    assert rag["rounds_without_speculation_share"] == 0.0
    rep = summarize(samples, 2)
    assert rep["categories"] == rows and rep["speedup"] == pytest.approx(13.2 / 5.9)
    assert {s["category"] for s in rep["samples"]} == {"qa", "rag"}  # report.json keeps each request's category
    md = markdown({"title": "t", "environment": {"time": "now"}, "bench": [{"protocol": "grpc", **rep}]})
    lo, hi = qa["speedup_ci95"]
    assert "### Per category" in md and f"| qa | 2 | {5 / 3.5:.2f}x | {lo:.2f}–{hi:.2f} | 1.88 | 0.44 | 11% |" in md
    # one category (or none): no table
    one = [s for s in samples if s.category == "qa"]
    assert per_category(one) == [] and "Per category" not in markdown(
        {"title": "t", "environment": {"time": "now"}, "bench": [{"protocol": "grpc", **summarize(one, 2)}]}
    )


def test_acceptance_the_server_does_not_report_is_na():
    """bench openai: the OpenAI API carries no acceptance, so its columns read n/a (never a made-up 0)."""
    samples = [
        RequestSample(model, i, 0, 20, 0.1, lat, 0.05, category=cat)
        for i, cat in enumerate(("qa", "rag"))
        for model, lat in ((BASELINE, 2.0), (SPECULATIVE, 1.0))
    ]
    rows = per_category(samples)
    assert [r["speedup"] for r in rows] == [2.0, 2.0]
    assert all(
        r[key] is None
        for r in rows
        for key in ("mean_acceptance_length", "acceptance_rate", "rounds_without_speculation_share")
    )
    md = markdown(
        {
            "title": "t",
            "environment": {"time": "now"},
            "bench": [{"protocol": "openai chat", **summarize(samples, None)}],
        }
    )
    assert "| qa | 1 | 2.00x | 2.00–2.00 | n/a | n/a | n/a |" in md
