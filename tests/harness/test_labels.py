"""What the reports call things is what they mean (issue 24's labels)."""

from __future__ import annotations

from trt_spec.harness.identity import CheckReport, format_check
from trt_spec.harness.report import apply_k, concurrency_table, k_label


def test_a_run_without_k_is_the_servers_default_not_none():
    assert k_label(None) == "k = the server's default" and k_label(4) == "k=4"


def test_tune_says_how_to_apply_its_k():
    text = apply_k(6)
    assert "`num_draft_tokens`" in text and '"num_draft_tokens": 6' in text
    assert "speculative.num_draft_tokens: 6" in text and "trt-spec repo" in text


def _level(c, speedup):
    side = {
        "requests": 4,
        "tokens_per_s": 10.0,
        "tpot_s": {"p50": 0.05},
        "latency_s": {"p50": 1.0, "p99": 2.0},
        "ttft_s": {"p50": 0.1},
    }
    return {
        "concurrency": c,
        "speedup": speedup,
        "acceptance": {"acceptance_rate": 0.5, "mean_acceptance_length": 2.0},
        "ensemble": side,
        "tensorrt_llm_bls": side,
    }


def test_slower_concurrency_levels_are_flagged():
    rows = "\n".join(concurrency_table([_level(1, 1.8), _level(8, 0.9)]))
    assert "**1.80x** |" in rows and "**0.90x (slower)** |" in rows


def test_a_chi_square_with_no_degrees_of_freedom_is_inconclusive_not_ok():
    rep = CheckReport("grpc", None)
    rep.distribution.append(
        {
            "prompt": "p",
            "samples": 8,
            "tokens": 1,
            "temperature": 0.1,
            "chi2": 0.0,
            "dof": 0,
            "p_value": 1.0,
            "passed": True,
            "inconclusive": True,
        }
    )
    text = format_check(rep)
    assert "INCONCLUSIVE" in text and "-> ok" not in text
