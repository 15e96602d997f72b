"""In-flight batching: the packed forward against solo forwards, and the scheduler's requests against the same
requests run alone through ReferenceEngine (token-identical greedy output, same sampling, same verify rule)."""

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
    logits = model.forward_packed(tokens, pos, [(c, len(p)) for c, p in zip(caches, prompts)],
                                  torch.arange(len(tokens)))
    for got, want in zip(logits.split([len(p) for p in prompts]), solo_prefill):
        if want.shape[0] > 1:
            assert torch.equal(got, want)
        else:  # a one-token prompt ran as one row alone
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    # one decode step for every sequence at its own position
    decode = model.forward_packed(torch.full((len(prompts),), 3), torch.tensor([len(p) for p in prompts]),
                                  [(c, 1) for c in caches], torch.arange(len(prompts)))
    for got, want in zip(decode, solo_decode):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_forward_rejects_bad_segments(target):
    cache = target.new_cache(1, 8)
    with pytest.raises(ValueError, match="disagree"):
        target.forward_packed(torch.tensor([1, 2]), torch.tensor([0, 1]), [(cache, 3)], torch.tensor([1]))
    with pytest.raises(ValueError, match="outside the cache"):
        target.forward_packed(torch.tensor([1]), torch.tensor([8]), [(cache, 1)], torch.tensor([0]))
    with pytest.raises(ValueError, match="batch-1"):
        target.forward_packed(torch.tensor([1]), torch.tensor([0]), [(target.new_cache(2, 8), 1)],
                              torch.tensor([0]))
