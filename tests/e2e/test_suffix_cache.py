"""The n-gram deployment's cross-request suffix cache on a real tritonserver: a request sent again under the same
tenant (the BLS's `tenant` input) is proposed from its first answer; under another tenant it is not. Slow: it builds
and serves the tiny n-gram deployment (the session's ngram_server) if no other test has."""

from __future__ import annotations

import uuid

from trt_spec.harness.client import LLMClient

PROMPT = "def total(prices, tax):\n    subtotal = sum(prices)\n    return"
GREEDY = {"exclude_input_in_output": True, "draft_len_policy": "fixed"}  # fixed: every round consults the proposer


def test_a_repeated_request_gets_more_accepted_tokens_under_its_own_tenant_only(ngram_server):
    c = LLMClient(ngram_server.grpc_url, "grpc")
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    base = c.generate("ensemble", PROMPT, 24, exclude_input_in_output=True)
    first = c.generate("tensorrt_llm_bls", PROMPT, 24, tenant=a, **GREEDY)
    again = c.generate("tensorrt_llm_bls", PROMPT, 24, tenant=a, **GREEDY)
    other = c.generate("tensorrt_llm_bls", PROMPT, 24, tenant=b, **GREEDY)
    assert first.output_ids == again.output_ids == other.output_ids == base.output_ids
    accepted = [g.metrics["total_accepted_draft_tokens"] for g in (first, again, other)]
    steps = [g.metrics["total_steps"] for g in (first, again, other)]
    assert accepted[1] > accepted[0] and steps[1] < steps[0], (accepted, steps)
    # the proposal lengths learn from every request, so b's counts need not equal a's first: what shows that b never
    # sees a's text is that none of b's accepted tokens came from the cache
    from_cache = [g.metrics["cache_accepted_tokens"] for g in (first, again, other)]
    assert from_cache[0] == 0 and from_cache[1] > 0 and from_cache[2] == 0, from_cache
