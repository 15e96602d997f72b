"""The reference engine behind Triton's core `tensorrt_llm` tensor interface (CPU, PyTorch).

It generates, or verifies `draft_input_ids` in one target forward (accepted prefix + one target token), as the
TensorRT-LLM backend does for the BLS. A byte-bounded LRU prefix KV cache (like TensorRT-LLM's block reuse) lets a
call compute only the tokens past a cached prefix; without it every draft-target round would re-read the prompt.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..records.defaults import PREFIX_CACHE_BYTES
from ..records.draft_policy import CostModel, DraftLengthPolicy
from ..records.speculation import Policy, engine_policy
from .accept import speculative_accept
from .eagle import Eagle3Head, HeadState
from .model import KVCache, ReferenceModel
from .numerics import GpuNumerics, context_phase
from .sampling import logits_to_probs

CAPACITY_STEP = 256  # KV-cache capacity granularity
DIVERGE_SLACK = 16  # a request diverging this close to a cached sequence's end takes it over


def load_head(engine_dir: str | Path, model: ReferenceModel) -> Optional[Eagle3Head]:
    """The EAGLE-3 head an engine directory carries, or None."""
    from .eagle import HEAD_DIR

    d = Path(engine_dir) / HEAD_DIR
    if not d.is_dir():
        return None
    head = Eagle3Head.load(d, model.config.num_layers)
    if head.cfg.hidden_size != model.config.hidden_size or head.cfg.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"{d}: the EAGLE-3 head (hidden {head.cfg.hidden_size}, vocab {head.cfg.vocab_size}) does not "
            f"fit the target (hidden {model.config.hidden_size}, vocab {model.config.vocab_size})"
        )
    return head


def load_engine(engine_dir: str | Path) -> ReferenceModel:
    """Load an exported engine directory or a plain HF directory."""
    import json

    from .export import ENGINE_META, load_engine_state_dict

    d = Path(engine_dir)
    if (d / ENGINE_META).is_file():
        return ReferenceModel.from_state_dict(json.loads((d / "config.json").read_text()), load_engine_state_dict(d))
    return ReferenceModel.from_pretrained(d)


def kv_bytes_per_position(model: ReferenceModel) -> int:
    """Bytes of K and V (fp32) one cached position takes."""
    c = model.config
    return c.num_layers * 2 * c.num_kv_heads * c.head_dim * 4


@dataclass
class CacheEntry:
    tokens: list[int]  # tokens whose K/V are valid
    cache: KVCache
    head: Optional[HeadState] = None  # EAGLE head K/V

    @property
    def capacity(self) -> int:
        return self.cache.max_len


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """LRU of CacheEntry bounded by bytes. take() hands out an entry exclusively; put() returns it."""

    def __init__(self, budget_bytes: int, bytes_per_position: int):
        self.budget = budget_bytes
        self.per_pos = bytes_per_position
        self._entries: "OrderedDict[int, CacheEntry]" = OrderedDict()
        self._lock = threading.Lock()
        self._next = 0
        self.hits = self.misses = self.reused_tokens = 0

    def bytes(self) -> int:
        return sum(e.capacity * self.per_pos for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def take(
        self, tokens: Sequence[int], copy: Callable[[CacheEntry, int], CacheEntry], slack: int = DIVERGE_SLACK
    ) -> tuple[Optional[CacheEntry], int]:
        """(entry, shared length) for the longest prefix match with `tokens`.

        An entry that `tokens` extends (within `slack` of its end) is handed out; otherwise its common prefix is
        copied, so concurrent requests never destroy each other's caches."""
        with self._lock:
            best_key, best_len = None, 0
            for key, e in self._entries.items():
                n = common_prefix(e.tokens, tokens)
                if n > best_len:
                    best_key, best_len = key, n
            if best_key is None:
                self.misses += 1
                return None, 0
            self.hits += 1
            self.reused_tokens += best_len
            entry = self._entries[best_key]
            if best_len >= len(entry.tokens) - slack:
                return self._entries.pop(best_key), best_len
            return copy(entry, best_len), best_len

    def put(self, entry: CacheEntry) -> None:
        with self._lock:
            self._entries[self._next] = entry
            self._next += 1
            while self._entries and self.bytes() > self.budget:
                self._entries.popitem(last=False)


@dataclass
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    # the kernels' logits transform (backend_contract.kernel_logits); None: raw logits
    kernel_temperature: Optional[float] = None
    logits_dtype: Optional[str] = None

    def logits(self, raw: torch.Tensor) -> torch.Tensor:
        if self.logits_dtype is None:
            return raw
        from ..records.backend_contract import kernel_logits

        return kernel_logits(raw, self.kernel_temperature, self.logits_dtype)

    def generator(self) -> Optional[torch.Generator]:
        if self.temperature <= 0:
            return None
        g = torch.Generator()
        g.manual_seed(self.seed if self.seed is not None else int(time.time_ns() % 2**63))
        return g


@dataclass
class CallResult:
    tokens: list[int] = field(default_factory=list)
    accepted: int = 0
    drafted: int = 0
    logits: list[torch.Tensor] = field(default_factory=list)
    cancelled: bool = False
    # RequestPerfMetrics timestamps (monotonic ns); 0 = not yet
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    reused_tokens: int = 0
    # EAGLE only, in process: (drafted, accepted) per step, and the policy's k per round (0 = plain run)
    rounds: list[tuple[int, int]] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)

    def token_time(self) -> None:
        self.last_token_ns = time.monotonic_ns()
        self.first_token_ns = self.first_token_ns or self.last_token_ns


class ReferenceEngine:
    """One loaded model + its prefix cache; calls run on a batching.BatchScheduler, `_compute` serializes forwards."""

    def __init__(
        self,
        model: ReferenceModel,
        max_seq_len: int,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        diverge_slack: int = DIVERGE_SLACK,
        head: Optional[Eagle3Head] = None,
        max_draft_len: int = 0,
        draft_policy: str = Policy.ADAPTIVE.value,
        numerics: Optional[GpuNumerics] = None,
        draft_costs: Optional[DraftCosts] = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """diverge_slack: max draft length + 1. head: speculate in-engine, up to max_draft_len per step, with
        draft_policy "fixed" or "adaptive" (costs from draft_costs, else measured at load). numerics: None = exact, else
        context-phase logits are perturbed (step_logits)."""
        self.model = model
        self.head = head
        self.max_draft_len = max_draft_len if head is not None else 0
        self.draft_policy = engine_policy(draft_policy)
        self.clock = clock
        self.policy: Optional[DraftLengthPolicy] = None  # costs shared by all requests
        if head is not None:
            self.policy = DraftLengthPolicy(self.draft_policy.value)
            if self.draft_policy is Policy.ADAPTIVE and self.max_draft_len:
                costs = draft_costs or measure_draft_costs(model, head, self.max_draft_len, clock=clock)
                costs.seed(self.policy.costs)
        self.slack = diverge_slack
        self.max_seq_len = max_seq_len
        self.prefix_cache = PrefixCache(prefix_cache_bytes, kv_bytes_per_position(model))
        self._compute = threading.Lock()
        self.numerics = numerics

    def step_logits(self, logits: torch.Tensor, tokens: Sequence[int], *, first_step: bool, fed: int) -> torch.Tensor:
        """A forward step's logits [n, V] for the last n positions of `tokens` (all fed so far), as its request sees
        them: in GPU-numerics mode perturbed iff the step ran in the context phase (numerics.context_phase)."""
        if self.numerics is None or not context_phase(first_step, fed):
            return logits
        return self.numerics.perturb(logits, tokens)

    def _copy_prefix(self, entry: CacheEntry, n: int, capacity: int) -> CacheEntry:
        fresh = self.model.new_cache(1, max(capacity, n + 1))
        for src, dst in ((entry.cache.k, fresh.k), (entry.cache.v, fresh.v)):
            for s, d in zip(src, dst):
                d[:, :, :n] = s[:, :, :n]
        head = entry.head.copy(max(n - 1, 0), max(capacity, n + 1)) if entry.head is not None else None
        return CacheEntry(list(entry.tokens[:n]), fresh, head)

    def _acquire(self, tokens: Sequence[int], need: int) -> CacheEntry:
        """An entry valid for a proper prefix of `tokens` (the last token is always re-fed), capacity >= need."""
        cap = min(self.max_seq_len + 1, -(-need // CAPACITY_STEP) * CAPACITY_STEP)
        entry, n = self.prefix_cache.take(tokens, lambda e, m: self._copy_prefix(e, m, cap), self.slack)
        n = min(n, len(tokens) - 1)
        if entry is None:
            entry, n = CacheEntry([], self.model.new_cache(1, cap)), 0
        elif entry.capacity < need:
            entry = self._copy_prefix(entry, n, max(cap, need))
        if self.head is not None:  # re-feed from the head's first stale slot
            valid = entry.head.valid_slots(tokens) if entry.head is not None else 0
            n = min(n, valid)
            if entry.head is None:
                entry.head = HeadState.new(self.head, max(cap, need))
            elif entry.head.capacity < need:
                entry.head = entry.head.copy(n, max(cap, need))
        entry.tokens = list(tokens[:n])
        return entry

    def _check_len(self, input_ids: Sequence[int], new: int) -> None:
        if not input_ids:
            raise ValueError("input_ids is empty")
        if len(input_ids) + new > self.max_seq_len:
            raise ValueError(f"input ({len(input_ids)} tokens) + output ({new}) exceeds max_seq_len {self.max_seq_len}")


# The adaptive chain stops once the product of the head's draft probabilities (EAGLE-2's signal) falls below this.
STOP_CONFIDENCE = 0.05


@dataclass(frozen=True)
class DraftCosts:
    """Seconds: forward_s[n - 1] = a forward feeding n tokens (n = 1..k + 1), head_s = one head step."""

    forward_s: tuple[float, ...]
    head_s: float

    def seed(self, costs: CostModel) -> None:
        """Seed the policy's load-1 costs: verify V(n), draft D(k) = k head steps, one decode step."""
        k = len(self.forward_s) - 1
        costs.seed(
            {n: self.forward_s[n - 1] for n in range(2, k + 2)},
            {d: d * self.head_s for d in range(1, k + 1)},
            self.forward_s[0],
        )


def measure_draft_costs(
    model: ReferenceModel, head: Eagle3Head, k: int, repeats: int = 3, clock: Callable[[], float] = time.perf_counter
) -> DraftCosts:
    """Median times of forwards of 1..k + 1 tokens and of a head step, on a scratch cache."""
    from .eagle import HeadState, head_step

    def median(f) -> float:
        ts = []
        for _ in range(repeats + 1):  # first run warms up
            t0 = clock()
            f()
            ts.append(clock() - t0)
        return sorted(ts[1:])[len(ts[1:]) // 2]

    ctx = 64
    cache = model.new_cache(1, ctx + k + 2)
    aux = head.cfg.aux_layers

    def fwd(n: int) -> None:
        model.forward_packed(
            torch.zeros(n, dtype=torch.long), torch.arange(ctx, ctx + n), [(cache, n)], torch.arange(n), aux_layers=aux
        )

    with torch.inference_mode():
        model.forward_packed(
            torch.zeros(ctx, dtype=torch.long), torch.arange(ctx), [(cache, ctx)], torch.tensor([ctx - 1])
        )
        forward = tuple(median(lambda n=n: fwd(n)) for n in range(1, k + 2))
        state = HeadState.new(head, ctx + k + 2)
        g = torch.zeros(1, head.cfg.hidden_size)
        e = model.embed[:1]
        step = median(lambda: head.logits(head_step(head, state, ctx, g, e)[0]))
    return DraftCosts(forward, step)


def accept_draft(
    draft: Sequence[int], draft_logits: Optional[torch.Tensor], logits: torch.Tensor, sampling: Sampling
) -> tuple[list[int], int]:
    """Target logits [k + 1, V] over x_last, d1..dk -> (accepted drafts + one target token, number accepted)."""
    k = len(draft)
    draft_probs = None
    if draft_logits is not None and sampling.temperature > 0:
        draft_probs = logits_to_probs(
            sampling.logits(draft_logits[:k].float()), sampling.temperature, sampling.top_k, sampling.top_p
        )
    return speculative_accept(
        torch.tensor(list(draft), dtype=torch.long),
        draft_probs,
        sampling.logits(logits),
        sampling.temperature,
        sampling.top_k,
        sampling.top_p,
        sampling.generator(),
    )


def cut_at_end(new: Sequence[int], accepted: int, end_id: Optional[int]) -> tuple[list[int], int]:
    """Tokens before the end token (backend_contract.EOS_EXCLUDED)."""
    new = list(new)
    if end_id is not None and end_id in new:
        new = new[: new.index(end_id)]
    return new, min(accepted, len(new))


def _ends_with_stop(tokens: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    return any(len(sw) and list(tokens[-len(sw) :]) == list(sw) for sw in stop_words)
