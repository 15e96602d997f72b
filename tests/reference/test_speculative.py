"""End-to-end speculative decoding on tiny random models: identity with target-only greedy, metrics, stops."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from trt_spec.reference.model import ReferenceModel  # noqa: E402
from trt_spec.reference.ngram import NgramDraft  # noqa: E402
from trt_spec.reference.speculative import SpecMetrics, generate  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 61, 12, 40], [120, 7, 33], [64]]


def greedy(target, prompts, n, **kw):
    return generate(target, prompts, n, **kw).tokens


class Recorder:
    """Wraps a model's forward to record the shape of every call."""

    def __init__(self, model: ReferenceModel, monkeypatch):
        self.calls: list[tuple[int, int]] = []
        inner = model.forward

        def forward(tokens, input_pos, cache, logits_at=None):
            self.calls.append((int(tokens.shape[1]), int(input_pos[0, 0])))
            return inner(tokens, input_pos, cache, logits_at=logits_at)

        monkeypatch.setattr(model, "forward", forward)


def test_draft_equal_to_target_accepts_everything(target, checkpoints):
    same = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    ref = greedy(target, PROMPTS, 30)
    res = generate(target, PROMPTS, 30, draft=same, k=4)
    assert res.tokens == ref
    m = res.metrics
    assert m.drafted > 0 and m.accepted == m.drafted and m.acceptance_rate == 1.0
    assert m.per_position_acceptance == [1.0, 1.0, 1.0, 1.0]
    # 1 token from prefill, 5 per step with k = 4, then k is clamped to the budget: 30 = 1 + 5 * 5 + 4.
    for row in res.row_metrics:
        assert row.steps == 6 and row.accepted_histogram == [0, 0, 0, 1, 5]
        assert row.mean_acceptance_length == pytest.approx(1 + 23 / 6)


def test_random_draft_is_rejected_and_output_unchanged(target, random_draft):
    ref = greedy(target, PROMPTS, 24)
    res = generate(target, PROMPTS, 24, draft=random_draft, k=3)
    assert res.tokens == ref
    m = res.metrics
    assert m.drafted > 30 and m.acceptance_rate < 0.15
    assert m.accepted_histogram[0] > 0.8 * m.steps


def test_close_draft_accepts_partially(target, close_draft):
    ref = greedy(target, PROMPTS, 32)
    res = generate(target, PROMPTS, 32, draft=close_draft, k=4)
    assert res.tokens == ref
    m = res.metrics
    assert 0.2 < m.acceptance_rate < 0.8
    rates = m.per_position_acceptance
    assert len(rates) == 4 and rates[0] >= rates[3]  # a later position is accepted only if earlier ones were
    assert sum(m.accepted_histogram) == m.steps
    assert sum(i * c for i, c in enumerate(m.accepted_histogram)) == m.accepted


def test_eos_inside_the_draft_stops_like_greedy(target, checkpoints):
    same = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    ref = greedy(target, [PROMPTS[0]], 30)[0]
    # EOS := a token greedy emits first at output index idx. With k = 4 and all drafts accepted, output
    # index 0 comes from prefill and each step drafts indices 5s+1 .. 5s+4: put EOS inside a draft.
    idx = next(i for i in range(6, 30) if i % 5 in (1, 2, 3) and ref[i] not in ref[:i])
    eos = ref[idx]
    for draft in (same, NgramDraft(3), None):
        res = generate(target, [PROMPTS[0]], 30, draft=draft, k=4, eos_token_ids=[eos])
        assert res.tokens == [ref[: idx + 1]] and res.finish_reasons == ["eos"]
        assert res.row_metrics[0].new_tokens == idx + 1
        if draft is same:  # the draft model stops proposing at its EOS: nothing past it is drafted
            m = res.row_metrics[0]
            assert m.drafted == m.accepted == idx + 1 - m.steps
    ignored = generate(target, [PROMPTS[0]], 30, draft=same, k=4, eos_token_ids=[eos], ignore_eos=True)
    assert ignored.tokens == [ref] and ignored.finish_reasons == ["length"]


def test_stop_words_end_the_output(target, checkpoints):
    same = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    ref = greedy(target, [PROMPTS[1]], 30)[0]
    stop = ref[9:11]
    first = next(i for i in range(len(ref) - 1) if ref[i:i + 2] == stop)
    res = generate(target, [PROMPTS[1]], 30, draft=same, k=4, stop_words=[[127, 126, 125], stop])
    assert res.tokens == [ref[: first + 2]] and res.finish_reasons == ["stop"]


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 6, 7])
def test_budget_boundary_with_k_larger_than_remaining(target, checkpoints, max_new):
    same = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    ref = greedy(target, [PROMPTS[0]], 7)[0]
    res = generate(target, [PROMPTS[0]], max_new, draft=same, k=8)
    assert res.tokens == [ref[:max_new]] and res.finish_reasons == ["length"]
    m = res.metrics
    # Never more drafts than the remaining budget - 1: a single step covers everything after prefill.
    assert m.drafted == max(max_new - 2, 0) and m.steps == (1 if max_new > 1 else 0)
    assert len(m.accepted_histogram) == 9


def test_batch_of_prompts_equals_each_prompt_alone(target, random_draft):
    for draft in (None, random_draft, NgramDraft(2)):  # PROMPTS have 10, 3 and 1 tokens: rows of different lengths
        batch = generate(target, PROMPTS, 16, draft=draft, k=3)
        alone = [generate(target, [p], 16, draft=draft, k=3).tokens[0] for p in PROMPTS]
        assert batch.tokens == alone


def test_ngram_generate_equals_greedy_and_accepts(target):
    # A prompt that repeats itself: the target's continuation is likely to copy parts of it.
    ref = greedy(target, PROMPTS, 40)
    res = generate(target, PROMPTS, 40, draft=NgramDraft(3), k=4)
    assert res.tokens == ref
    m = res.metrics
    assert m.accepted > 0 and m.time_draft_s > 0
    # Every new token comes from prefill (1 per row), a step (1 each) or an accepted draft.
    assert m.steps + m.accepted + len(PROMPTS) == m.new_tokens == 3 * 40


def test_verification_is_one_forward_and_the_draft_is_cached(target, checkpoints, monkeypatch):
    draft = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    t_rec, d_rec = Recorder(target, monkeypatch), Recorder(draft, monkeypatch)
    prompt = PROMPTS[0]
    res = generate(target, [prompt], 21, draft=draft, k=4)
    m = res.metrics
    # Target: prefill, then exactly one forward per step over last token + k drafts.
    assert t_rec.calls[0] == (len(prompt), 0)
    assert [s for s, _ in t_rec.calls[1:]] == [5, 5, 5, 5] and m.steps == 4
    # Draft: the first call sees prompt + first token; afterwards it only gets tokens it has not seen
    # (all 4 accepted -> the last draft and the bonus token: 2, then 1 per autoregressive step).
    assert d_rec.calls[0] == (len(prompt) + 1, 0)
    assert [s for s, _ in d_rec.calls[1:]] == [1, 1, 1] + [2, 1, 1, 1] * 3


def test_sampling_is_seeded_and_self_draft_is_accepted(target, checkpoints):
    same = ReferenceModel.from_pretrained(checkpoints["llama"][1])
    kw = dict(temperature=0.8, top_k=50, top_p=0.95)
    a = generate(target, PROMPTS, 20, draft=same, k=3, seed=123, **kw)
    b = generate(target, PROMPTS, 20, draft=same, k=3, seed=123, **kw)
    c = generate(target, PROMPTS, 20, draft=same, k=3, seed=124, **kw)
    assert a.tokens == b.tokens and a.tokens != c.tokens
    assert all(len(t) == 20 for t in a.tokens)
    assert a.metrics.acceptance_rate > 0.95  # q == p up to float rounding of a 1- vs 4-token forward
    n = generate(target, PROMPTS, 20, draft=NgramDraft(2), k=3, seed=7, **kw)
    assert all(len(t) == 20 for t in n.tokens)


def test_metrics_merge_and_rates():
    a = SpecMetrics.for_k(2)
    a.record_step(2, 1)
    a.record_step(1, 1)
    a.new_tokens, a.wall_time_s = 4, 2.0
    b = SpecMetrics.for_k(3)
    b.record_step(3, 3)
    b.record_step(0, 0)
    b.new_tokens, b.wall_time_s = 6, 1.0
    m = SpecMetrics.merge([a, b])
    assert (m.drafted, m.accepted, m.steps, m.new_tokens) == (6, 5, 4, 10)
    assert m.position_drafted == [3, 2, 1] and m.position_accepted == [3, 1, 1]
    assert m.accepted_histogram == [1, 2, 0, 1]
    assert m.mean_acceptance_length == pytest.approx(1 + 5 / 3)  # 3 steps drafted; the one that did not is apart
    assert m.acceptance_rate == pytest.approx(5 / 6)
    assert m.per_position_acceptance == pytest.approx([1.0, 0.5, 1.0])
    assert m.tokens_per_s == pytest.approx(10 / 3.0)
    assert SpecMetrics.for_k(4).acceptance_rate is None  # undefined without drafts (trt_spec.records.speculation)


def test_invalid_arguments_are_clear_errors(target, checkpoints):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate(target, PROMPTS, 0)
    with pytest.raises(ValueError, match="k must be >= 0"):
        generate(target, PROMPTS, 4, draft=NgramDraft(), k=-1)
    with pytest.raises(ValueError, match="non-empty"):
        generate(target, [[1], []], 4)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 128\)"):
        generate(target, [[1, 128]], 4)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(target, PROMPTS, 4, temperature=-1.0)
    with pytest.raises(TypeError, match="draft must be"):
        generate(target, PROMPTS, 4, draft="ngram")
    hf, _ = checkpoints["llama"]
    cfg = {**hf.config.to_dict(), "vocab_size": 64}
    small = ReferenceModel.from_state_dict(
        cfg, {k: (v[:64] if k in ("model.embed_tokens.weight", "lm_head.weight") else v)
              for k, v in hf.state_dict().items()})
    with pytest.raises(ValueError, match="draft vocab_size 64 != target vocab_size 128"):
        generate(target, PROMPTS, 4, draft=small)
