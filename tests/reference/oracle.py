"""Plain greedy decoding straight on a ReferenceModel's forward (prefill, then one token at a time, one private
cache): the oracle the engine, the scheduler and the speculative loop are compared with. Nothing of theirs is used."""

from __future__ import annotations

import torch


def plain_greedy(model, prompt: list[int], n: int, end_id: int | None = None) -> list[int]:
    """n greedy tokens after prompt (fewer when end_id comes: it is not output, as the engine does not output it)."""
    cache = model.new_cache(1, len(prompt) + n)
    seq = list(prompt)
    logits = model.forward(
        torch.tensor([seq]), torch.arange(len(seq))[None], cache, logits_at=torch.tensor([[len(seq) - 1]])
    )
    out: list[int] = []
    while len(out) < n:
        tok = int(logits[0, -1].argmax())
        if tok == end_id:
            break
        out.append(tok)
        seq.append(tok)
        logits = model.forward(torch.tensor([[tok]]), torch.tensor([[len(seq) - 1]]), cache)
    return out
