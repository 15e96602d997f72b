"""In-flight batching: the packed forward against solo forwards, and the scheduler's requests against the same
requests run alone, one at a time (token-identical greedy output, same sampling, same verify rule)."""

from __future__ import annotations

import pytest
import torch

from trt_spec.reference.model import ReferenceModel


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral_window", "llama_tied_rope3", "llama_bias"])
def test_packed_forward_matches_solo_forwards(checkpoints, kind, one_thread):
    """Prefill / multi-row rows are bit-identical to each sequence's own forward (oneDNN rows do not depend on
    the row count); a decode row differs from its solo one-row (MKL gemv) forward only by rounding."""
    model = ReferenceModel.from_pretrained(checkpoints[kind][1])
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 2, 3], [9] * 11, [42]]
    solo_prefill, solo_decode = [], []
    for p in prompts:
        cache = model.new_cache(1, 32)
        solo_prefill.append(model.forward(torch.tensor([p]), torch.arange(len(p))[None], cache)[0])
        solo_decode.append(model.forward(torch.tensor([[3]]), torch.tensor([[len(p)]]), cache)[0, 0])

    caches = [model.new_cache(1, 32) for _ in prompts]
    tokens = torch.tensor([t for p in prompts for t in p])
    pos = torch.cat([torch.arange(len(p)) for p in prompts])
    logits = model.forward_packed(
        tokens, pos, [(c, len(p)) for c, p in zip(caches, prompts)], torch.arange(len(tokens))
    )
    for got, want in zip(logits.split([len(p) for p in prompts]), solo_prefill):
        if want.shape[0] > 1:
            assert torch.equal(got, want)
        else:  # a one-token prompt ran as one row alone
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    # one decode step for every sequence at its own position
    decode = model.forward_packed(
        torch.full((len(prompts),), 3),
        torch.tensor([len(p) for p in prompts]),
        [(c, 1) for c in caches],
        torch.arange(len(prompts)),
    )
    for got, want in zip(decode, solo_decode):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_two_row_packed_forward_is_exact(target):
    """Two rows run as three (a faster oneDNN kernel); the result is still the solo forward's, bit for bit."""
    want = target.forward(torch.tensor([[4, 9]]), torch.arange(2)[None], target.new_cache(1, 8))[0]
    got = target.forward_packed(torch.tensor([4, 9]), torch.arange(2), [(target.new_cache(1, 8), 2)], torch.arange(2))
    assert torch.equal(got, want)


def test_packed_forward_rejects_bad_segments(target):
    cache = target.new_cache(1, 8)
    with pytest.raises(ValueError, match="disagree"):
        target.forward_packed(torch.tensor([1, 2]), torch.tensor([0, 1]), [(cache, 3)], torch.tensor([1]))
    with pytest.raises(ValueError, match="outside the cache"):
        target.forward_packed(torch.tensor([1]), torch.tensor([8]), [(cache, 1)], torch.tensor([0]))
    with pytest.raises(ValueError, match="batch-1"):
        target.forward_packed(torch.tensor([1]), torch.tensor([0]), [(target.new_cache(2, 8), 1)], torch.tensor([0]))


# -- the scheduler ---------------------------------------------------------------------------------------------
import random  # noqa: E402
import threading  # noqa: E402

from trt_spec.reference.batching import BatchScheduler, QueueFullError  # noqa: E402
from trt_spec.reference.engine import ReferenceEngine, Sampling  # noqa: E402

GREEDY = Sampling()
MAX_SEQ = 256


@pytest.fixture(scope="module")
def model(sharp_model):
    return sharp_model


def alone(model, kind, *args, **kw):
    """The request run alone: a one-request batch on a fresh ReferenceEngine (no prefix cache from other requests)."""
    with BatchScheduler(ReferenceEngine(model, MAX_SEQ), max_batch_size=1) as solo:
        return getattr(solo, f"submit_{kind}")(*args, **kw).result(120)


def assert_same_tokens(model, prompt, got, want, label):
    """Equal, or fail saying whether the first difference is a near-tie flipped by fp32 rounding that depends
    on the matmul's row count (MKL gemv for one row solo, oneDNN in a batch) or a real batching bug."""
    if got == want:
        return
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    seq = list(prompt) + list(want[:i])
    logits = model.forward(
        torch.tensor([seq]),
        torch.arange(len(seq))[None],
        model.new_cache(1, len(seq)),
        logits_at=torch.tensor([[len(seq) - 1]]),
    )[0, 0]
    top2 = logits.topk(2).values
    margin = float(top2[0] - top2[1])
    cause = (
        "a near-tie flipped by batch-size-dependent fp32 rounding"
        if margin < 1e-3
        else "not a near-tie: a batching bug"
    )
    pytest.fail(
        f"{label}: batched {got} != alone {want}, first difference at token {i}; "
        f"solo top-2 logit margin there {margin:.3g} ({cause})"
    )


def mixed_requests(model, n=16, seed=0):
    """n requests: greedy generate (mixed prompt lengths and lengths, end_id, stop words) and verify (mixed k,
    right and wrong drafts), each with its solo result."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, 128) for _ in range(rng.choice([1, 3, 9, 17, 33, 60]))]
        ref = alone(model, "generate", prompt, 24, GREEDY).tokens
        if i % 3 == 2:  # verify k drafts after a few generated tokens
            j, k = rng.randrange(0, 8), rng.choice([0, 1, 3, 5, 8])
            draft = list(ref[j : j + k])
            if k and rng.random() < 0.6:
                c = rng.randrange(k)
                draft[c] = (draft[c] + 1) % 128
            inp = prompt + ref[:j]
            out.append(("verify", inp, dict(draft=draft), alone(model, "verify", inp, draft, GREEDY)))
        else:
            kw: dict = {"max_new": rng.choice([1, 5, 12, 24])}
            if i % 5 == 1:
                kw["end_id"] = ref[3]
            elif i % 5 == 3:
                kw["stop_words"] = [ref[5:7]]
            want = alone(
                model,
                "generate",
                prompt,
                kw["max_new"],
                GREEDY,
                end_id=kw.get("end_id"),
                stop_words=kw.get("stop_words", ()),
            )
            out.append(("generate", prompt, kw, want))
    return out


def submit(sch, kind, inp, kw, **extra):
    if kind == "verify":
        return sch.submit_verify(inp, kw["draft"], GREEDY, **extra)
    kw = dict(kw)
    return sch.submit_generate(inp, kw.pop("max_new"), GREEDY, **kw, **extra)


def test_mixed_requests_joining_mid_flight_are_token_identical(model, one_thread):
    """16 mixed requests (prompt lengths 1..60, generate and verify with k in 0..8, end_id, stop words) through
    4 slots and a 24-token budget (prompts are chunked, requests queue), half of them joining mid-flight, one
    stopped by should_stop and one cancelled in the middle: every other request is token-identical to its solo
    run; the stopped ones hold a prefix of theirs."""
    reqs = mixed_requests(model)
    started = threading.Event()
    streamed: dict[int, list[int]] = {0: []}

    def first_on_token(t):
        streamed[0].append(t)
        if len(streamed[0]) == 3:
            started.set()

    stop_after = {"n": 0}

    def should_stop():
        stop_after["n"] += 1
        return stop_after["n"] >= 4

    long_prompt = list(range(3, 50))
    cancel_ref = alone(model, "generate", long_prompt, 40, GREEDY).tokens
    stop_ref = alone(model, "generate", long_prompt[::-1], 40, GREEDY).tokens
    with BatchScheduler(ReferenceEngine(model, MAX_SEQ), max_batch_size=4, max_num_tokens=24) as sch:
        handles = [submit(sch, *reqs[0][:3], on_token=first_on_token)]
        handles += [submit(sch, *r[:3]) for r in reqs[1:8]]
        stopped = sch.submit_generate(long_prompt[::-1], 40, GREEDY, should_stop=should_stop)
        holder: list = []
        n_cancel = {"n": 0}

        def cancel_on_5th(_t):
            n_cancel["n"] += 1
            if n_cancel["n"] == 5:
                holder[0].cancel()

        holder.append(sch.submit_generate(long_prompt, 40, GREEDY, on_token=cancel_on_5th))
        assert started.wait(30)
        handles += [submit(sch, *r[:3]) for r in reqs[8:]]  # join mid-flight
        results = [h.result(timeout=60) for h in handles]
        cancelled, stopped_res = holder[0].result(timeout=60), stopped.result(timeout=60)
    stats = list(sch.stats)

    for i, ((kind, inp, kw, want), got) in enumerate(zip(reqs, results)):
        assert_same_tokens(model, inp, got.tokens, want.tokens, f"request {i} ({kind}, {kw})")
        assert (got.accepted, got.drafted, got.cancelled) == (want.accepted, want.drafted, False)
    assert streamed[0] == results[0].tokens
    assert cancelled.cancelled and 5 <= len(cancelled.tokens) < 40
    assert_same_tokens(model, long_prompt, cancelled.tokens, cancel_ref[: len(cancelled.tokens)], "cancelled")
    assert stopped_res.cancelled and len(stopped_res.tokens) == 4  # should_stop is asked after each token
    assert_same_tokens(model, long_prompt[::-1], stopped_res.tokens, stop_ref[:4], "should_stop")
    # the slot pool and the token budget held, requests queued, and sequences really shared forwards
    assert max(s.tokens for s in stats) <= 24 and max(s.sequences for s in stats) <= 4
    assert max(s.active for s in stats) == 4 and max(s.waiting for s in stats) > 0
    assert sum(s.sequences > 1 for s in stats) > len(stats) // 2


def test_full_slot_pool_queues_and_whole_contexts_wait_without_chunking(model, one_thread):
    prompts = [[7 + i] * (10 + 7 * i) for i in range(6)]  # 10..45 tokens
    want = [alone(model, "generate", p, 6, GREEDY).tokens for p in prompts]
    with BatchScheduler(
        ReferenceEngine(model, MAX_SEQ), max_batch_size=2, max_num_tokens=48, chunked_context=False
    ) as sch:
        with pytest.raises(ValueError, match="max_num_tokens 48"):
            sch.submit_generate([5] * 49, 2, GREEDY)
        handles = [sch.submit_generate(p, 6, GREEDY) for p in prompts]
        got = [h.result(timeout=60).tokens for h in handles]
    for p, g, w in zip(prompts, got, want):
        assert_same_tokens(model, p, g, w, f"prompt of {len(p)}")
    stats = list(sch.stats)
    assert max(s.active for s in stats) == 2 and max(s.sequences for s in stats) == 2
    assert max(s.waiting for s in stats) > 0
    assert max(s.tokens for s in stats) <= 48
    # no context was split: every iteration feeds whole prompts (>= 10 tokens) or decode steps (1 token each)
    assert all(s.tokens <= 2 or s.tokens >= 10 for s in stats)


def test_sampling_and_verify_with_draft_logits_match_solo(model, one_thread):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 128) for _ in range(n)] for n in (4, 11, 25, 40)]
    samplings = [Sampling(0.8, 20, 0.95, seed=s) for s in range(len(prompts))]
    want = [alone(model, "generate", p, 16, s).tokens for p, s in zip(prompts, samplings)]
    gen = torch.Generator().manual_seed(3)
    draft_logits = torch.randn(4, 128, generator=gen) * 3
    draft = [int(t) for t in draft_logits.argmax(-1)]
    vs = Sampling(1.0, 0, 1.0, seed=11)
    want_v = alone(model, "verify", prompts[1], draft, vs, draft_logits=draft_logits)
    with BatchScheduler(ReferenceEngine(model, MAX_SEQ), max_batch_size=8, max_num_tokens=128) as sch:
        handles = [sch.submit_generate(p, 16, s) for p, s in zip(prompts, samplings)]
        hv = sch.submit_verify(prompts[1], draft, vs, draft_logits=draft_logits)
        got = [h.result(timeout=60).tokens for h in handles]
        got_v = hv.result(timeout=60)
    assert got == want
    assert (got_v.tokens, got_v.accepted) == (want_v.tokens, want_v.accepted)


def test_prefix_kv_reuse_per_sequence(model, one_thread):
    """Each finished sequence puts its KV back; a BLS-style continuation of it computes only its new tokens."""
    prompts = [list(range(3 + i, 40 + i)) for i in range(3)]
    eng = ReferenceEngine(model, MAX_SEQ)
    with BatchScheduler(eng, max_batch_size=4, max_num_tokens=256) as sch:
        first = [h.result(timeout=60).tokens for h in [sch.submit_generate(p, 6, GREEDY) for p in prompts]]
        before = eng.prefix_cache.reused_tokens
        nxt = [
            h.result(timeout=60).tokens for h in [sch.submit_generate(p + f, 6, GREEDY) for p, f in zip(prompts, first)]
        ]
        reused = eng.prefix_cache.reused_tokens - before
        ver = [sch.submit_verify(p + f + n, [1, 2], GREEDY).result(timeout=60) for p, f, n in zip(prompts, first, nxt)]
    assert reused >= sum(len(p) + 6 - 1 for p in prompts)
    for p, f, n, v in zip(prompts, first, nxt, ver):
        full = alone(model, "generate", p, 13, GREEDY).tokens
        assert_same_tokens(model, p, f + n + v.tokens[v.accepted :], full, "continuation")


def test_queue_limit_failing_callback_and_close(model, one_thread):
    release = threading.Event()
    entered = threading.Event()

    def block(_t):
        entered.set()
        assert release.wait(30)

    def boom(_t):
        raise RuntimeError("client went away")

    sch = BatchScheduler(ReferenceEngine(model, MAX_SEQ), max_batch_size=1, max_num_tokens=64, max_queue_size=2)
    try:
        a = sch.submit_generate([5, 6, 7], 3, GREEDY, on_token=block)
        assert entered.wait(30)  # the engine thread is inside a's callback: the others stay queued
        b = sch.submit_generate([8, 9], 4, GREEDY, on_token=boom)
        c = sch.submit_generate([10, 11, 12], 5, GREEDY)
        with pytest.raises(QueueFullError, match="Maximum queue size of 2"):
            sch.submit_generate([1], 1, GREEDY)
        release.set()
        assert a.result(timeout=60).tokens == alone(model, "generate", [5, 6, 7], 3, GREEDY).tokens
        with pytest.raises(RuntimeError, match="client went away"):
            b.result(timeout=60)
        assert c.result(timeout=60).tokens == alone(model, "generate", [10, 11, 12], 5, GREEDY).tokens
        assert len(sch.engine.prefix_cache) == 3  # the failed request's KV went back too
        with pytest.raises(ValueError, match="max_seq_len"):
            sch.submit_generate([1] * 250, 10, GREEDY)
    finally:
        release.set()
        sch.close(timeout=30)
    with pytest.raises(RuntimeError, match="closed"):
        sch.submit_generate([1], 1, GREEDY)
