"""Token selection: greedy argmax, or seeded sampling with temperature / top-k / top-p."""

from __future__ import annotations

import torch


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = disabled), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = disabled), got {top_p}")


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> fp32 probabilities after temperature, top-k and top-p; temperature > 0 only."""
    validate_sampling(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("logits_to_probs needs temperature > 0; greedy decoding uses argmax")
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        # drop a token once the mass before it reaches top_p (the top token always stays)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs [..., V] -> sampled ids [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def select(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [..., V] -> (tokens [...], probs [..., V] or None when greedy argmax)."""
    if temperature == 0:
        validate_sampling(temperature, top_k, top_p)
        return logits.argmax(dim=-1), None
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    return sample_from(probs, generator), probs
