"""The accept rule of one verification: greedy prefix matching, or exact rejection sampling.

p = target probabilities, q = draft probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampling import logits_to_probs, sample_from, validate_sampling


def speculative_accept(
    draft_tokens: torch.Tensor | Sequence[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """(new tokens, drafts accepted) for one row: draft_tokens [k], draft_probs [k, V] or None, logits [k + 1, V]."""
    draft = torch.as_tensor(draft_tokens, dtype=torch.int64).reshape(1, -1)
    probs = None if draft_probs is None else draft_probs[None]
    out, n = speculative_accept_batch(draft, probs, target_logits[None], temperature, top_k, top_p, generator)
    n0 = int(n[0])
    return out[0, : n0 + 1].tolist(), n0


def speculative_accept_batch(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify B rows of k drafts: (tokens [B, k + 1], num_accepted [B]), each row n accepted + one target token + -1s.

    draft_tokens [B, k]; draft_probs [B, k, V] or None (one-hot: a deterministic draft); target_logits [B, k + 1, V].
    Sampling accepts x_i with probability min(1, p/q) and resamples from max(0, p - q) at the first rejection.
    """
    B, k = draft_tokens.shape
    if target_logits.shape[:2] != (B, k + 1):
        raise ValueError(f"target_logits must be [B, k + 1, V] = [{B}, {k + 1}, V], got {list(target_logits.shape)}")
    if draft_probs is not None and draft_probs.shape[:2] != (B, k):
        raise ValueError(f"draft_probs must be [B, k, V] = [{B}, {k}, V], got {list(draft_probs.shape)}")
    positions = torch.arange(k + 1)

    if temperature == 0:
        validate_sampling(temperature, top_k, top_p)
        target = target_logits.argmax(dim=-1)  # [B, k + 1]
        n = torch.cumprod((draft_tokens == target[:, :k]).int(), 1).sum(1)  # [B]
        # accepted drafts equal the argmax, so the output is the argmax prefix
        return target.masked_fill(positions > n[:, None], -1), n

    p = logits_to_probs(target_logits, temperature, top_k, top_p)  # [B, k + 1, V]
    V = p.shape[-1]
    drafts = draft_tokens[..., None]  # [B, k, 1]
    p_x = p[:, :k].gather(-1, drafts)[..., 0]  # [B, k]
    q_x = draft_probs.gather(-1, drafts)[..., 0] if draft_probs is not None else torch.ones(B, k)
    u = torch.rand(B, k, generator=generator)
    n = torch.cumprod((u * q_x < p_x).int(), 1).sum(1)  # accept while u < p/q (no division by q)

    rows = torch.arange(B)
    p_n = p[rows, n]  # [B, V]
    rejected = (n < k)[:, None]
    n_draft = n.clamp(max=max(k - 1, 0))
    if k == 0:
        q_n = torch.zeros(B, V)
    elif draft_probs is not None:
        q_n = draft_probs[rows, n_draft]
    else:
        q_n = torch.nn.functional.one_hot(draft_tokens[rows, n_draft], V).float()
    residual = (p_n - q_n * rejected).clamp_(min=0)
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 only when p == q up to rounding (a rejection is then ~impossible)
    last = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    token = sample_from(last, generator)  # [B]

    out = torch.cat([draft_tokens, torch.full((B, 1), -1)], 1)
    out[rows, n] = token
    return out.masked_fill(positions > n[:, None], -1), n
