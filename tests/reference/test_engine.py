"""The reference engine behind the Triton interface: prefix KV cache reuse, divergence, eviction,
concurrency, and verify/generate semantics equal to plain greedy decoding. A solo call is a one-request batch of
the scheduler (the engine has no other way to run one)."""

from __future__ import annotations

import threading

import pytest

from trt_spec.reference.batching import BatchScheduler
from trt_spec.reference.engine import ReferenceEngine, Sampling

from .oracle import plain_greedy

GREEDY = Sampling()


class Solo:
    """One engine, its calls made one at a time through a BatchScheduler (max_batch_size 1 unless given)."""

    def __init__(self, engine: ReferenceEngine, max_batch_size: int = 1):
        self.scheduler = BatchScheduler(engine, max_batch_size=max_batch_size)

    def generate(self, input_ids, n, sampling, **kw):
        return self.scheduler.submit_generate(input_ids, n, sampling, **kw).result(120)

    def verify(self, input_ids, draft, sampling, **kw):
        return self.scheduler.submit_verify(input_ids, draft, sampling, **kw).result(120)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.scheduler.close()


@pytest.fixture(scope="module")
def model(sharp_model):
    return sharp_model


def greedy(model, prompt, n):
    return plain_greedy(model, prompt, n)


def test_generate_and_verify_match_plain_greedy(model):
    eng = ReferenceEngine(model, max_seq_len=256)
    run = Solo(eng)
    prompt = [5, 17, 33, 2, 90, 41]
    ref = greedy(model, prompt, 12)
    assert run.generate(prompt, 12, GREEDY).tokens == ref
    # verify: right drafts are all accepted + bonus; a wrong draft stops at the target's own token
    res = run.verify(prompt, ref[:4], GREEDY)
    assert res.tokens == ref[:5] and res.accepted == 4
    wrong = [ref[0], (ref[1] + 1) % 128, ref[2]]
    res = run.verify(prompt, wrong, GREEDY)
    assert res.tokens == ref[:2] and res.accepted == 1


def test_prefix_reuse_computes_only_new_tokens(model):
    eng = ReferenceEngine(model, max_seq_len=256)
    run = Solo(eng)
    prompt = list(range(3, 40))
    first = run.generate(prompt, 6, GREEDY).tokens
    before = eng.prefix_cache.reused_tokens
    nxt = run.generate(prompt + first, 6, GREEDY).tokens
    assert eng.prefix_cache.reused_tokens - before >= len(prompt) + len(first) - 1
    assert first + nxt == greedy(model, prompt, 12)


def test_divergent_request_is_correct_and_keeps_the_other_cache(model):
    eng = ReferenceEngine(model, max_seq_len=256, diverge_slack=5)
    run = Solo(eng)
    a = list(range(3, 60))
    b = a[:5] + [100, 101, 102] + a[8:]  # shares only 5 tokens with a
    run.generate(a, 4, GREEDY)
    assert run.generate(b, 8, GREEDY).tokens == greedy(model, b, 8)
    assert len(eng.prefix_cache) == 2  # b copied a's 5 shared positions instead of destroying a's entry
    before = eng.prefix_cache.reused_tokens
    assert run.generate(a, 4, GREEDY).tokens == greedy(model, a, 4)
    assert eng.prefix_cache.reused_tokens - before >= len(a) - 1
    # a request that diverges near the end of a cached sequence (rejected drafts) takes it over and overwrites
    c = a[:-2] + [7, 7]
    assert run.generate(c, 5, GREEDY).tokens == greedy(model, c, 5)


def test_cache_is_bounded_by_bytes(model):
    eng = ReferenceEngine(model, max_seq_len=256, prefix_cache_bytes=3 * 256 * 2 * 2 * 2 * 16 * 4)
    run = Solo(eng)
    for i in range(6):
        run.generate([i + 3] * 10, 2, GREEDY)
    assert eng.prefix_cache.bytes() <= eng.prefix_cache.budget and len(eng.prefix_cache) <= 3


def test_concurrent_requests_do_not_mix(model):
    eng = ReferenceEngine(model, max_seq_len=256)
    run = Solo(eng, max_batch_size=8)  # the calls of 8 threads share forwards
    prompts = [[i + 3, (i * 7) % 120, 11, 50 + i] * 4 for i in range(8)]
    expected = [greedy(model, p, 10) for p in prompts]
    out = [None] * len(prompts)

    def worker(i):
        toks = list(prompts[i])
        got = []
        while len(got) < 10:  # BLS-style: many short calls interleaved with other requests
            r = run.generate(toks, 2, GREEDY)
            got += r.tokens
            toks += r.tokens
        out[i] = got[:10]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == expected


def test_temperature_zero_on_half_logits_is_not_greedy_and_on_float_logits_it_is(model):
    """The stand-in decodes through TensorRT-LLM's penalty kernel (backend_contract.kernel_logits): a sent temperature
    scales the logits by 1/(T + 1e-6) and half logits clamp at +-65504. So a client's temperature 0 (meant as
    greedy) on an engine with ModelOpt's float16 logits picks among thousands of ties — the output is nonsense,
    visible here on CPU; on the float32 logits trt-spec builds, and with no temperature at all, it is greedy."""
    from trt_spec.records import backend_contract as bc

    eng = ReferenceEngine(model, max_seq_len=256)
    run = Solo(eng)
    prompt = [5, 17, 33, 2, 90, 41]
    ref = greedy(model, prompt, 12)
    kernel = lambda t, dtype: Sampling(kernel_temperature=t, logits_dtype=dtype)  # noqa: E731
    assert run.generate(prompt, 12, kernel(None, bc.FP16_LOGITS)).tokens == ref
    assert run.generate(prompt, 12, kernel(0.0, bc.LOGITS_DTYPE)).tokens == ref
    assert run.generate(prompt, 12, kernel(0.0, bc.FP16_LOGITS)).tokens != ref
    # verification goes through the same transform: the right drafts are rejected on half logits at T = 0
    assert run.verify(prompt, ref[:4], kernel(0.0, bc.LOGITS_DTYPE)).accepted == 4
    assert run.verify(prompt, ref[:4], kernel(0.0, bc.FP16_LOGITS)).accepted < 4
