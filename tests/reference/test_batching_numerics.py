"""The GPU-numerics mode (reference/numerics.py) in the batching scheduler: a request's context-phase rows are
perturbed, its one-token decode rows are exact, and a position's noise depends on its prefix only, so a teacher-forced
probe sees what any other context-phase forward of that position saw (what `trt-spec check` measures and probes)."""

from __future__ import annotations

import pytest
import torch

from trt_spec.reference.batching import BatchScheduler
from trt_spec.reference.engine import ReferenceEngine, Sampling
from trt_spec.reference.numerics import GpuNumerics

MAX_SEQ = 256
NUMERICS = GpuNumerics(0.5, seed=7)


@pytest.fixture(scope="module")
def model(sharp_model):
    return sharp_model


def run(model, numerics, prompt, n, max_num_tokens=256):
    """(n greedy tokens with their logits rows, the logits of a teacher-forced one-token probe of each position)."""
    eng = ReferenceEngine(model, MAX_SEQ, numerics=numerics)
    with BatchScheduler(eng, max_batch_size=2, max_num_tokens=max_num_tokens, chunked_context=True) as sch:
        gen = sch.submit_generate(prompt, n, Sampling(), return_logits=True).result(60)
        # the prefix cache holds each prefix: a probe feeds one token, and is a context phase all the same
        probes = [
            sch.submit_generate(prompt + gen.tokens[:j], 1, Sampling(), return_logits=True).result(60).logits[0]
            for j in range(n)
        ]
        assert eng.prefix_cache.reused_tokens >= sum(len(prompt) + j - 1 for j in range(n))
    return gen, probes


@pytest.mark.parametrize("max_num_tokens", [256, 8])  # the prompt whole, or in chunks of 8 (one context phase)
def test_context_phase_rows_are_perturbed_decode_rows_exact(model, one_thread, max_num_tokens):
    prompt = list(range(3, 40))
    exact, exact_probes = run(model, None, prompt, 6, max_num_tokens)  # same chunks: same rounding
    gen, probes = run(model, NUMERICS, prompt, 6, max_num_tokens)
    assert gen.tokens == exact.tokens  # the sharp model's margins are O(1): no flip to follow
    # row 0 is the prefill's (context phase): perturbed; rows 1.. are one-token decode steps: exact
    assert torch.equal(gen.logits[0], NUMERICS.perturb(exact.logits[0][None], prompt)[0])
    assert (gen.logits[0] - exact.logits[0]).abs().max() > NUMERICS.margin / 4
    for j in range(1, 6):
        assert torch.equal(gen.logits[j], exact.logits[j])
    for j in range(6):  # each probe: perturbed by its prefix's noise; position 0's equals the generation's row 0
        prefix = prompt + gen.tokens[:j]
        assert torch.equal(probes[j], NUMERICS.perturb(exact_probes[j][None], prefix)[0])
        assert (probes[j] - exact_probes[j]).abs().max() > NUMERICS.margin / 4
    assert torch.allclose(probes[0], gen.logits[0], atol=1e-5)


def test_a_position_gets_the_same_noise_in_every_forward_and_only_from_its_prefix():
    """A verification's row i (tokens = prompt + k drafts fed, k + 1 rows) predicts position len(prompt) + i: its noise
    is that of a one-row probe of the same prefix; another seed or prefix gives other noise, all within margin / 2."""
    tokens, v = [5, 9, 2, 7, 7, 1], 50
    rows = NUMERICS.perturb(torch.zeros(4, v), tokens)  # positions 3..6
    for i in range(4):
        assert torch.equal(rows[i], NUMERICS.perturb(torch.zeros(1, v), tokens[: 3 + i])[0])
    assert rows.abs().max() <= NUMERICS.margin / 2 and not torch.equal(rows[0], rows[1])
    other = GpuNumerics(NUMERICS.margin, seed=8).perturb(torch.zeros(1, v), tokens[:3])[0]
    assert not torch.equal(other, rows[0])
    assert not torch.equal(NUMERICS.perturb(torch.zeros(1, v), [5, 9, 3])[0], rows[0])
    with pytest.raises(ValueError, match="need at least 4 tokens fed"):
        NUMERICS.perturb(torch.zeros(4, v), tokens[:3])
