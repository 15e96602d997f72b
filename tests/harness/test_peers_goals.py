"""benchmarks/peers.py's goals block: issue 45's goals as ratios with a 95% interval resampled by prompt (a
conversation's turns stay together), met only where the ratio itself reaches the goal."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from trt_spec.harness.bench import RequestSample
from trt_spec.records.names import BASELINE, SPECULATIVE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("peers", ROOT / "benchmarks" / "peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


def _result(workload: str, turns: list[tuple[int, int, float, float, int, int]]) -> dict:
    """A bench result of (prompt, turn, baseline s, speculative s, tokens, target calls) turns."""
    samples = []
    for p, t, b, s, n, calls in turns:
        samples += [
            RequestSample(BASELINE, p, 0, n, b, b, None, category=workload, turn=t).__dict__,
            RequestSample(SPECULATIVE, p, 0, n, s, s, None, 0, 0, calls, category=workload, turn=t).__dict__,
        ]
    return {"samples": samples}


def test_tokens_per_call_ratio_and_its_interval_by_conversation():
    # ours: conversation 0 copies well (8 tokens a call), 1 poorly (2); the peer 4 on both
    ours = peers._by_prompt(
        _result("agentic", [(0, 1, 1, 1, 80, 10), (0, 2, 1, 1, 80, 10), (1, 1, 1, 1, 20, 10)]), "agentic"
    )
    theirs = peers._by_prompt(
        _result("agentic", [(0, 1, 1, 1, 40, 10), (0, 2, 1, 1, 40, 10), (1, 1, 1, 1, 40, 10)]), "agentic"
    )
    a, b, r, (lo, hi) = peers.goal_ratio("tpc", ours, theirs)
    assert (a, b) == (6.0, 4.0) and r == 1.5
    # resampling whole conversations: all-0 gives 2.0, all-1 gives 0.5, so the interval spans both ends
    assert lo == 0.5 and hi == 2.0


def test_goals_block_says_met_only_where_the_ratio_reaches_the_goal():
    code = [(i, 1, 2.0, 1.0, 96, 30) for i in range(4)]  # 2x, 3.2 tokens a call
    hf = [(i, 1, 2.0, 1.2, 96, 30) for i in range(4)]  # 1.67x: ours / HF = 1.2 >= 1.15
    vllm = [(i, 1, 2.0, 1.0, 96, 29) for i in range(4)]  # 3.31 tokens a call: ours falls short
    report = {
        "workloads": ["code-edit"],
        "systems": {
            "trt-spec-fp32-fixed": {"result": _result("code-edit", code)},
            "trt-spec-fp32-adaptive": {"result": _result("code-edit", code)},
            "hf-prompt-lookup": {"result": _result("code-edit", hf)},
            "vllm-ngram": {"result": _result("code-edit", vllm)},
        },
    }
    rows = {(line.split(" | ")[0], line.split(" | ")[3].split(":")[0]): line for line in peers.goals(report)[2:]}
    tpc = rows[("| tokens per target call", "vLLM 0.32 CPU n-gram (n 1-3, k 8)")]
    assert "0.967 (0.967–0.967)" in tpc and tpc.endswith("| **no** |")
    speed = rows[("| speedup", "HF prompt lookup (k 8)")]
    assert "1.200" in speed and speed.endswith("| yes |")
    assert len(rows) == 2  # no agentic or Spec-Bench turns: no rows for them
