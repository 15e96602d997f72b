"""Speculative decoding on the reference runtime: the accept rule, draft proposers, generate(), metrics.

Naming (used throughout): p = target probabilities, q = draft probabilities.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch

from .model import ReferenceModel
from .ngram import NgramDraft
from .sampling import logits_to_probs, sample_from, select, validate_sampling
from ..records.speculation import acceptance_rate, mean_acceptance_length

FinishReason = Literal["length", "eos", "stop"]


def speculative_accept(
    draft_tokens: torch.Tensor | Sequence[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """Verify one row of k draft tokens; return (new tokens, number of drafts accepted).

    draft_tokens: [k]; draft_probs: [k, V] or None; target_logits: [k + 1, V]. See speculative_accept_batch.
    """
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
    """Verify B rows of k draft tokens each against the target's logits.

    draft_tokens: [B, k] int64; draft_probs: [B, k, V] q rows the drafts were sampled from, or None for a
    deterministic draft (n-gram), which is q = one-hot on its token; target_logits: [B, k + 1, V], row i
    predicting the token after draft i-1.
    Returns (tokens [B, k + 1], num_accepted [B]): row b holds its n_b accepted drafts, then one target token
    (the correction, or the bonus when all k are accepted), then -1 padding.

    Greedy (temperature == 0): accept the longest prefix where draft == target argmax, then the argmax at the
    first mismatch. Sampling: accept x_i with probability min(1, p(x_i) / q(x_i)); at the first rejection i
    sample from normalize(max(0, p_i - q_i)); if all are accepted sample the bonus from p_k. The output
    distribution equals the target's.
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
        # Accepted drafts equal the argmax, so the output is the argmax prefix of length n + 1.
        return target.masked_fill(positions > n[:, None], -1), n

    p = logits_to_probs(target_logits, temperature, top_k, top_p)  # [B, k + 1, V]
    V = p.shape[-1]
    drafts = draft_tokens[..., None]  # [B, k, 1]
    p_x = p[:, :k].gather(-1, drafts)[..., 0]  # [B, k]
    q_x = draft_probs.gather(-1, drafts)[..., 0] if draft_probs is not None else torch.ones(B, k)
    u = torch.rand(B, k, generator=generator)
    n = torch.cumprod((u * q_x < p_x).int(), 1).sum(1)  # accept while u < p/q (no division by q)

    rows = torch.arange(B)
    p_n = p[rows, n]  # [B, V]: p at the first rejection, or p_k when all k were accepted
    rejected = (n < k)[:, None]
    n_draft = n.clamp(max=max(k - 1, 0))
    if k == 0:
        q_n = torch.zeros(B, V)
    elif draft_probs is not None:
        q_n = draft_probs[rows, n_draft]
    else:
        q_n = torch.nn.functional.one_hot(draft_tokens[rows, n_draft], V).float()
    residual = (p_n - q_n * rejected).clamp_(min=0)  # == p_k for rows that accepted everything
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 only when p == q up to rounding, where a rejection has ~zero probability: use p itself.
    last = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    token = sample_from(last, generator)  # [B]

    out = torch.cat([draft_tokens, torch.full((B, 1), -1)], 1)
    out[rows, n] = token
    return out.masked_fill(positions > n[:, None], -1), n


@dataclass
class SpecMetrics:
    """Decode metrics (vLLM definitions). steps = target forward passes after prefill, each verifying the
    drafts it got (0 drafts = plain decode step). Counts add up across rows/requests with `merge`."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    new_tokens: int = 0
    position_drafted: list[int] = field(default_factory=list)  # [k]: steps whose draft had a token at i
    position_accepted: list[int] = field(default_factory=list)  # [k]: ... and that token was accepted
    accepted_histogram: list[int] = field(default_factory=list)  # [k + 1]: steps that accepted a tokens
    time_draft_s: float = 0.0  # draft proposals (model forwards + selection, or n-gram lookup)
    time_target_s: float = 0.0  # target forwards, prefill included
    wall_time_s: float = 0.0

    @classmethod
    def for_k(cls, k: int) -> SpecMetrics:
        return cls(position_drafted=[0] * k, position_accepted=[0] * k, accepted_histogram=[0] * (k + 1))

    @property
    def mean_acceptance_length(self) -> Optional[float]:
        """trt_spec.records.speculation's: 1 + accepted / speculative rounds (steps that drafted a token; a step with nothing
        to draft is counted apart, as the served loop's rounds without speculation are)."""
        return mean_acceptance_length(self.accepted, self.speculative_steps)

    @property
    def speculative_steps(self) -> int:
        """Steps that drafted at least one token (a speculative round, vLLM's "draft")."""
        return self.position_drafted[0] if self.position_drafted else 0

    @property
    def acceptance_rate(self) -> Optional[float]:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s else 0.0

    def record_step(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        for i in range(drafted):
            self.position_drafted[i] += 1
            self.position_accepted[i] += i < accepted
        self.accepted_histogram[accepted] += 1

    @classmethod
    def merge(cls, items: Iterable[SpecMetrics]) -> SpecMetrics:
        """Sum of all counts and times (lists of different k are zero-padded)."""
        items = list(items)
        k = max((len(m.position_drafted) for m in items), default=0)
        out = cls.for_k(k)
        for m in items:
            for name in ("drafted", "accepted", "steps", "new_tokens", "time_draft_s", "time_target_s", "wall_time_s"):
                setattr(out, name, getattr(out, name) + getattr(m, name))
            for name in ("position_drafted", "position_accepted", "accepted_histogram"):
                total = getattr(out, name)
                for i, v in enumerate(getattr(m, name)):
                    total[i] += v
        return out


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # per row: new tokens only (EOS / stop word included)
    finish_reasons: list[FinishReason]
    row_metrics: list[SpecMetrics]

    @property
    def metrics(self) -> SpecMetrics:
        return SpecMetrics.merge(self.row_metrics)


@dataclass(frozen=True)
class _Sampling:
    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return select(logits, self.temperature, self.top_k, self.top_p, self.generator)


class _ModelDrafter:
    """A draft ReferenceModel with its own cache; `seen` = how many sequence positions its cache holds."""

    def __init__(self, model: ReferenceModel, max_len: int):
        self.model = model
        self.cache = model.new_cache(1, max_len)
        self.seen = 0

    def propose(
        self, seq: list[int], k: int, sampling: _Sampling, eos: frozenset[int]
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to k draft tokens after seq, ending early at an EOS (+ their q rows [n, V] when sampling).
        Feeds the draft model only the tokens its cache has not seen."""
        L = len(seq)
        new = torch.tensor([seq[self.seen :]])
        at = torch.tensor([[L - self.seen - 1]])
        logits = self.model.forward(new, torch.arange(self.seen, L)[None], self.cache, logits_at=at)
        tokens: list[int] = []
        probs = []
        for i in range(k):
            tok, q = sampling.select(logits[0, -1])
            tokens.append(int(tok))
            probs.append(q)
            if i + 1 == k or tokens[-1] in eos:
                break
            logits = self.model.forward(tok.view(1, 1), torch.tensor([[L + i]]), self.cache)
        self.seen = L + len(tokens) - 1  # the last draft token was not fed
        return tokens, None if sampling.temperature == 0 else torch.stack(probs)

    def rewind(self, valid_len: int) -> None:
        """After verification only the first valid_len positions match the sequence; later ones get overwritten."""
        self.seen = min(self.seen, valid_len)


def generate(
    target: ReferenceModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    draft: ReferenceModel | NgramDraft | None = None,
    k: int = 4,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_ids: Iterable[int] = (),
    stop_words: Sequence[Sequence[int]] = (),
    ignore_eos: bool = False,
) -> GenerationResult:
    """Generate up to max_new_tokens per prompt, speculatively when a draft is given.

    Rows run one after another (each batch-1; the runtime itself accepts batches) and one seeded generator
    serves the whole call. k is the number of draft tokens per step for any draft (an NgramDraft's own k is
    ignored here), clamped per step to max_new_tokens - generated - 1. A row stops at EOS (included, unless
    ignore_eos) or when its output ends with a stop word (included); stop words match within the output.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token lists")
    vocab = target.config.vocab_size
    if any(not 0 <= t < vocab for p in prompts for t in p):
        raise ValueError(f"prompt token ids must be in [0, {vocab})")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if draft is not None and not isinstance(draft, (ReferenceModel, NgramDraft)):
        raise TypeError(f"draft must be a ReferenceModel, an NgramDraft or None, got {type(draft).__name__}")
    if isinstance(draft, ReferenceModel) and draft.config.vocab_size != vocab:
        raise ValueError(f"draft vocab_size {draft.config.vocab_size} != target vocab_size {vocab}")
    if any(len(w) == 0 for w in stop_words):
        raise ValueError("stop_words must not contain empty sequences")
    validate_sampling(temperature, top_k, top_p)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    sampling = _Sampling(temperature, top_k, top_p, generator)
    k = k if draft is not None else 0
    eos = frozenset(() if ignore_eos else eos_token_ids)
    stops = [list(w) for w in stop_words]

    tokens, reasons, metrics = [], [], []
    for prompt in prompts:
        out, reason, m = _generate_row(target, list(prompt), max_new_tokens, draft, k, sampling, eos, stops)
        tokens.append(out)
        reasons.append(reason)
        metrics.append(m)
    return GenerationResult(tokens, reasons, metrics)


def _generate_row(
    target: ReferenceModel,
    prompt: list[int],
    max_new: int,
    draft: ReferenceModel | NgramDraft | None,
    k: int,
    sampling: _Sampling,
    eos: frozenset[int],
    stops: list[list[int]],
) -> tuple[list[int], FinishReason, SpecMetrics]:
    m = SpecMetrics.for_k(k)
    t_start = time.perf_counter()
    P = len(prompt)
    cache = target.new_cache(1, P + max_new)  # positions fed never exceed P + max_new - 1
    drafter = _ModelDrafter(draft, P + max_new) if isinstance(draft, ReferenceModel) else None
    seq = list(prompt)

    def append(new: list[int]) -> FinishReason | None:
        """Append tokens one by one; stop at the first that finishes the row."""
        for tok in new:
            seq.append(tok)
            n_out = len(seq) - P
            if tok in eos:
                return "eos"
            if any(n_out >= len(w) and seq[-len(w) :] == w for w in stops):
                return "stop"
            if n_out == max_new:
                return "length"
        return None

    t0 = time.perf_counter()
    at = torch.tensor([[P - 1]])
    logits = target.forward(torch.tensor([prompt]), torch.arange(P)[None], cache, logits_at=at)
    m.time_target_s += time.perf_counter() - t0
    reason = append([int(sampling.select(logits[0, -1])[0])])

    while reason is None:
        L = len(seq)  # the target cache holds positions < L - 1; seq[-1] is not fed yet
        step_k = min(k, max_new - (L - P) - 1)
        drafts: list[int] = []
        q = None
        if step_k > 0:
            t0 = time.perf_counter()
            if drafter is not None:
                drafts, q = drafter.propose(seq, step_k, sampling, eos)
            else:
                drafts = draft.propose(seq, step_k, eos)
            m.time_draft_s += time.perf_counter() - t0

        # One target forward over [last token, drafts...] at positions L-1 .. L-1+len(drafts).
        t0 = time.perf_counter()
        positions = torch.arange(L - 1, L + len(drafts))[None]
        logits = target.forward(torch.tensor([seq[-1:] + drafts]), positions, cache)
        m.time_target_s += time.perf_counter() - t0
        new, n_acc = speculative_accept(drafts, q, logits[0], sampling.temperature, sampling.top_k,
                                        sampling.top_p, sampling.generator)
        m.record_step(len(drafts), n_acc)
        if drafter is not None:
            drafter.rewind(L + n_acc)
        reason = append(new)

    m.new_tokens = len(seq) - P
    m.wall_time_s = time.perf_counter() - t_start
    return seq[P:], reason, m
