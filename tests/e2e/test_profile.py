"""`bench served --profile` against the farm's shared n-gram server: the BLS's `return_profile` input gives each
speculative request a profile, and the bench's table of them accounts for the measured request time; without the
input the responses are what they always were."""

from __future__ import annotations

import json

from trt_spec.harness.client import GREEDY, LLMClient
from trt_spec.records.names import PROFILE, SPECULATIVE
from trt_spec.records.profile import PARTS, RequestProfile

from ..farm import cli_in_process

PROMPT = "def total(prices, tax):\n    subtotal = sum(prices)\n    return subtotal"


def test_bench_profile_accounts_for_the_measured_request_time(ngram_server, tmp_path):
    r = cli_in_process(
        "bench",
        "served",
        "--url",
        ngram_server.grpc_url,
        "--prompts",
        "code",
        "--limit",
        "3",
        "--max-tokens",
        "24",
        "--policy",
        "fixed",
        "--profile",
        "--format",
        "json",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["bench"][0]
    p = b["profile"]
    spec = [s for s in b["samples"] if s["model"] == SPECULATIVE]
    assert p["requests"] == len(spec) == 3
    assert [x["part"] for x in p["parts"]] == [k for k, _ in PARTS]
    assert all(x["seconds"] >= 0 for x in p["parts"]), p["parts"]  # Triton's share too: the BLS's time is inside
    measured = sum(s["latency_s"] for s in spec)
    assert abs(sum(x["seconds"] for x in p["parts"]) - measured) <= 0.01 * measured
    # every target call is in the table, by kind and tokens submitted: one per round the server counted
    assert sum(c["count"] for c in p["calls"]) == sum(s["steps"] for s in spec)
    assert {c["call"] for c in p["calls"]} >= {"prefill", "verify"}
    target = next(x["seconds"] for x in p["parts"] if x["part"] == "target_s")
    assert abs(sum(c["seconds"] for c in p["calls"]) - target) < 1e-6
    assert "Where the speculative requests' time went" in (tmp_path / "report.md").read_text()


def test_without_return_profile_nothing_changes(ngram_server):
    """Only a request that sets return_profile gets the output; the text and the other outputs are the same either way
    (their counts may differ: the proposal lengths learn from every request)."""
    c = LLMClient(ngram_server.grpc_url, "grpc")
    plain = c.generate(SPECULATIVE, PROMPT, 16, stream=True, draft_len_policy="fixed", **GREEDY)
    profiled = c.generate(SPECULATIVE, PROMPT, 16, stream=True, draft_len_policy="fixed", return_profile=True, **GREEDY)
    assert PROFILE not in plain.metrics
    assert profiled.output_ids == plain.output_ids and profiled.text == plain.text
    assert set(profiled.metrics) - {PROFILE} == set(plain.metrics)
    p = RequestProfile.from_json(profiled.metrics[PROFILE])
    assert 0 < p.bls_s < profiled.latency_s
    assert sum(c for c, _ in p.calls.values()) == profiled.metrics["total_steps"]
    http = LLMClient(ngram_server.http_url, "http").generate(
        SPECULATIVE, PROMPT, 16, draft_len_policy="fixed", **GREEDY
    )
    assert PROFILE not in http.metrics and http.output_ids == plain.output_ids
