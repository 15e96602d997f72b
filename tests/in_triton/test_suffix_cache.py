"""The suffix proposer's cross-request cache (trt_spec/in_triton/proposers.py SuffixCache) in the BLS's loop: scopes and
tenant isolation, bounds and eviction, the store's candidate budget, and that the output stays the target's (the cache
only changes drafts). The loop runs against the strict backend double, with the fixed policy so that every round
consults the proposer and a request's counts are a function of its proposals alone."""

import asyncio
import dataclasses

import pytest

from trt_spec.in_triton.proposers import SuffixCache, SuffixProposer, SuffixStore
from trt_spec.in_triton.spec_metrics import SpecMetricsExporter
from trt_spec.in_triton.speculative_loop import RequestError, check_tenant
from trt_spec.records import defaults
from trt_spec.records import names as n
from trt_spec.records.bls_parameters import BlsParameters
from trt_spec.records.deployment import SuffixCacheConfig

from .test_spec_metrics import FakeMetricFamily, FakePbUtils, metric
from .test_speculative_loop import baseline, req, run, setup

PROMPT = [40, 41, 42, 43, 44, 45, 46, 47]  # no repeats: the request's own sequence gives the proposer little
OTHER = [12, 30, 31, 9, 8]


def ngram_loop(scope="tenant", **bounds):
    loop, target, _ = setup("ngram", policy="fixed", proposer="suffix")
    cfg = dataclasses.replace(loop.cfg, suffix_cache=SuffixCacheConfig(scope, **bounds))
    loop.__init__(cfg, loop.call, clock=lambda: 0.0)  # verification costs nothing: every proposal is verified whole
    return loop, target


def counts(m):
    return (m.drafted, m.accepted, m.steps, m.draft_lengths)


def test_a_repeated_request_of_the_same_tenant_is_proposed_from_its_first_answer():
    loop, _ = ngram_loop()
    first, m1, _ = run(loop, req(PROMPT, 40, 4, tenant="a"))
    again, m2, _ = run(loop, req(PROMPT, 40, 4, tenant="a"))
    assert first == again == baseline(PROMPT, 40)  # the cache changes drafts, never the output
    assert m2.accepted > m1.accepted and m2.steps < m1.steps
    assert not any(r.cached for r in m1.rounds) and any(r.cached for r in m2.rounds)
    assert m2.cache_tokens == len(PROMPT) + 40  # one copy: the repeat made the stored one the most recent


def test_one_tenants_text_is_never_proposed_to_another():
    loop, _ = ngram_loop()
    fresh, _ = ngram_loop()
    _, alone, _ = run(fresh, req(PROMPT, 40, 4, tenant="b"))
    run(loop, req(PROMPT, 40, 4, tenant="a"))
    out, m, _ = run(loop, req(PROMPT, 40, 4, tenant="b"))
    assert out == baseline(PROMPT, 40)
    # b's request is exactly what it is on a loop that never saw a's: the same proposals, round by round
    assert counts(m) == counts(alone) and not any(r.cached for r in m.rounds)
    assert [t for _, idx in loop.cache.store("a").sources() for t in idx.tokens] == PROMPT + out


def test_without_a_tenant_the_tenant_scope_neither_reads_nor_writes():
    loop, _ = ngram_loop()
    _, m1, _ = run(loop, req(PROMPT, 40, 4))
    _, m2, _ = run(loop, req(PROMPT, 40, 4))
    assert counts(m1) == counts(m2) and loop.cache.num_tokens == 0 and loop.cache.num_stores == 0
    run(loop, req(PROMPT, 40, 4, tenant="a"))
    _, m3, _ = run(loop, req(PROMPT, 40, 4))  # a's text is not proposed to a request without a tenant either
    assert counts(m3) == counts(m1)


def test_deployment_scope_shares_across_tenants_and_off_keeps_nothing():
    shared, _ = ngram_loop("deployment")
    _, m1, _ = run(shared, req(PROMPT, 40, 4, tenant="a"))
    out, m2, _ = run(shared, req(PROMPT, 40, 4))  # another client (none named): the shared store serves it
    assert out == baseline(PROMPT, 40) and m2.accepted > m1.accepted
    off, _ = ngram_loop("off")
    assert off.cache is None
    _, o1, _ = run(off, req(PROMPT, 40, 4, tenant="a"))
    _, o2, _ = run(off, req(PROMPT, 40, 4, tenant="a"))
    assert counts(o1) == counts(o2) == counts(m1) and o2.cache_tokens is None


def test_only_the_suffix_proposer_in_ngram_mode_gets_a_cache():
    assert setup("draft_target")[0].cache is None
    assert setup("ngram", proposer="prompt_lookup")[0].cache is None
    assert setup("ngram", proposer="suffix")[0].cache is not None  # the default scope: tenant


def test_concurrent_requests_keep_the_output_and_the_tenants_apart():
    loop, _ = ngram_loop()
    reqs = [req(p, 30, 4, tenant="a") for p in (PROMPT, OTHER)] + [req(p, 30, 4, tenant="b") for p in ([5, 9, 11], [7])]

    async def all_of_them():
        return await asyncio.gather(*(loop.generate(r, lambda new: None) for r in reqs))

    results = asyncio.run(all_of_them())
    for r, (out, _) in zip(reqs, results):
        assert out == baseline(r.prompt, 30)
    for t in ("a", "b"):
        stored = sorted(tuple(idx.tokens) for _, idx in loop.cache.store(t).sources())
        assert stored == sorted(tuple(r.prompt + out) for r, (out, _) in zip(reqs, results) if r.tenant == t)


def test_a_tenant_evicts_only_its_own_sequences_and_the_least_recent_tenant_goes_first():
    cache = SuffixCache(SuffixCacheConfig("tenant", max_tokens=20, max_sequences=2, max_tenants=2, min_match=2))
    cache.add("a", [1, 2, 3, 4])
    for i in range(10):  # b floods its own store: a keeps what it had
        cache.add("b", [100 + i, 101 + i, 102 + i, 103 + i, 104 + i, 105 + i, 106 + i, 107 + i])
    assert len(cache.store("a")) == 1 and len(cache.store("b")) == 2 and cache.store("b").num_tokens == 16
    cache.store("a")  # a used most recently: a new tenant drops b, the least recently used
    cache.add("c", [7, 8, 9])
    assert cache.num_stores == 2 and cache.store("a").num_tokens == 4
    assert cache.store("b").num_tokens == 0  # b is back empty (and has now pushed out c)
    assert cache.num_tokens == 4 and cache.num_stores == 2


def test_a_repeated_sequence_is_stored_once_and_becomes_the_most_recent():
    store = SuffixStore(max_sequences=2, anchor_len=2)
    store.add([1, 2, 3, 30])
    store.add([5, 6, 7])
    store.add([1, 2, 3, 30])
    store.add([8, 9, 10])  # evicts [5, 6, 7], the oldest now
    assert [idx.tokens for _, idx in store.sources()] == [[1, 2, 3, 30], [8, 9, 10]]
    assert store.num_tokens == 7


def test_the_store_gives_at_most_max_candidates_anchor_hits_most_recent_first():
    store = SuffixStore(anchor_len=2)
    store.add([9, 1, 2, 3, 30])  # older, and a longer match of [..., 9, 1, 2, 3]
    store.add([1, 2, 3, 40])
    assert SuffixProposer(8, store=store, max_candidates=1).propose([9, 1, 2, 3]) == [40]  # only the latest looked at
    assert SuffixProposer(8, store=store, max_candidates=2).propose([9, 1, 2, 3]) == [30]  # the longest match wins


def test_the_store_proposes_only_on_a_match_of_its_anchor_length():
    store = SuffixStore(anchor_len=defaults.SUFFIX_CACHE_MIN_MATCH)
    store.add([4, 5, 77, 78])
    p = SuffixProposer(8, min_match=1, store=store)
    assert p.propose([1, 5]) == [] and not p.store_hit  # one token: the sequence's own text only
    assert p.propose([4, 5]) == [77, 78] and p.store_hit
    with pytest.raises(ValueError, match="anchor_len"):
        SuffixProposer(8, min_match=1, max_match=1, store=store)


def test_bounds_and_scope_are_checked():
    # an unknown scope is refused where the record is built, before any cache or loop exists
    with pytest.raises(ValueError, match="'everyone' is not a valid CacheScope"):
        SuffixCacheConfig("everyone", max_tokens=1, max_sequences=1, max_tenants=1)
    with pytest.raises(ValueError, match="max_tenants must be an integer >= 1"):
        SuffixCache(SuffixCacheConfig("tenant", max_tokens=1, max_sequences=1, max_tenants=0))
    with pytest.raises(ValueError, match="min_match must be an integer >= 1"):
        SuffixCache(SuffixCacheConfig("tenant", max_tokens=1, max_sequences=1, max_tenants=1, min_match=0))
    with pytest.raises(ValueError, match="'x' is not a valid CacheScope"):
        ngram_loop("x")


def test_tenant_ids():
    assert check_tenant(None) is None and check_tenant("") is None and check_tenant("team-a") == "team-a"
    with pytest.raises(RequestError, match="tenant is 257 bytes, more than 256"):
        check_tenant("x" * 257)


def test_the_deployments_bounds_reach_the_loop_through_the_bls_parameters():
    p = BlsParameters.from_parameters(
        {
            "tensorrt_llm_model_name": "tensorrt_llm",
            "speculative_mode": "ngram",
            "max_draft_len": "4",
            "num_draft_tokens": "4",
            "ngram_size": "3",
            "draft_len_policy": "fixed",
            "proposer": "suffix",
            "max_seq_len": "256",
            "max_num_tokens": "256",
            "tokenizer_dir": "/t",
            "suffix_cache_scope": "deployment",
            "suffix_cache_max_tokens": "100",
            "suffix_cache_max_sequences": "3",
            "suffix_cache_max_tenants": "5",
        }
    )
    loop, _ = ngram_loop()
    loop.__init__(p, loop.call)
    c = loop.cache
    assert (c.scope, c.cfg.max_tokens, c.cfg.max_sequences, c.cfg.max_tenants) == ("deployment", 100, 3, 5)
    older = BlsParameters.from_parameters({k: v for k, v in p.to_parameters().items() if "suffix_cache" not in k})
    assert older.suffix_cache.scope == "tenant"  # a repository written before the cache: the defaults


def test_cache_metrics_are_published_when_the_cache_is_on():
    FakeMetricFamily.created = []
    loop, _ = ngram_loop()
    run(loop, req(PROMPT, 40, 4, tenant="a"))
    _, m, _ = run(loop, req(PROMPT, 40, 4, tenant="a"))
    sm = SpecMetricsExporter(FakePbUtils, "tensorrt_llm_bls", "ngram", 4, suffix_cache=True)
    sm.observe(m)
    sm.close()
    cached = [r for r in m.rounds if r.cached]
    assert metric(n.METRIC_CACHE_ROUNDS).total == len(cached) > 0
    assert metric(n.METRIC_CACHE_ACCEPTED).total == sum(r.accepted for r in cached) > 0
    assert metric(n.METRIC_CACHE_TOKENS).total == loop.cache.num_tokens
    FakeMetricFamily.created = []
    SpecMetricsExporter(FakePbUtils, "tensorrt_llm_bls", "ngram", 4).close()
    assert n.METRIC_CACHE_TOKENS not in {f.name for f in FakeMetricFamily.created}


@pytest.mark.parametrize("min_match", [1, 3])
def test_the_cache_matches_across_requests_from_its_configured_length(min_match):
    """speculative.suffix_cache.min_match: another request's text is proposed from a match of that many tokens."""
    loop, _ = ngram_loop(min_match=min_match)
    assert loop.cache.store("a").anchor_len == min_match
    run(loop, req([4, 5, 6, 77, 78, 79], 4, 4, tenant="a"))
    p = SuffixProposer(8, min_match=1, store=loop.cache.store("a"))
    assert bool(p.propose([9, 9, 6])) == (min_match == 1)  # a one-token match of the stored text
    assert p.propose([4, 5, 6])[:1] == [77]  # three tokens match: proposed under either length
