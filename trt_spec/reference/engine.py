"""The reference engine behind Triton's core `tensorrt_llm` tensor interface (CPU, PyTorch).

Semantics mirror the TensorRT-LLM backend as the BLS uses it (the calls themselves run on batching.BatchScheduler,
the stand-in's in-flight batching; standin.StandIn puts the backend's contract in front of it):
- no draft tokens: generate up to `request_output_len` tokens (greedy or sampled), stopping after `end_id`
  or a stop word (both kept); streaming yields each token as it is produced;
- `draft_input_ids` d1..dk: one target forward over [last input token, d1..dk] verifies them; the output is
  the accepted prefix plus one token of the target's own (a bonus token when all k agree). Greedy accepts
  while d_i == argmax; sampling uses rejection sampling against `draft_logits` when given, else token
  matching against the target's own samples (both exact).

Prefix KV cache across requests (TensorRT-LLM's KV-cache block reuse, which draft-target needs): a call
whose input_ids extend a cached sequence computes only the new tokens; otherwise every BLS round would
re-read the whole prefix and the speedup would collapse. Entries are (tokens whose K/V are valid, a static
position-addressed KVCache). A call *takes* the best-matching entry out of the LRU (exclusive while the call
runs: no shared mutable state between in-flight calls) and puts it back extended; a divergent request reuses
the common prefix and overwrites the rest. Bounded by bytes (LRU eviction).
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
from .numerics import GpuNumerics
from .sampling import logits_to_probs

CAPACITY_STEP = 256  # KV-cache capacity grows in multiples of this many positions
DIVERGE_SLACK = 16  # default: a request may diverge this close to the end of a cached sequence and take it over


def load_head(engine_dir: str | Path, model: ReferenceModel) -> Optional[Eagle3Head]:
    """The EAGLE-3 head an engine directory carries (export --eagle_head), or None."""
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
    """An exported engine directory (FP8/bf16/fp32, see export.py) or a plain HF directory."""
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
    tokens: list[int]  # tokens whose K/V are valid at positions 0..len-1
    cache: KVCache
    head: Optional[HeadState] = None  # an EAGLE engine's head K/V for the same sequence (eagle.HeadState)

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
        """The entry sharing the longest prefix with `tokens`, and that length.

        An entry that `tokens` extends (or leaves within `slack` positions of its end: the same request's
        rejected draft tokens) is removed and handed out. An entry that only shares an early prefix with
        `tokens` (another request's sequence) stays cached for its owner: its common prefix is copied into a
        new entry instead, so concurrent requests never destroy each other's caches."""
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
                self._entries.popitem(last=False)  # least recently used


@dataclass
class Sampling:
    temperature: float = 0.0  # of the sampling rule: 0 = argmax (greedy)
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    # What TensorRT-LLM's kernels do to the logits first (backend_contract.kernel_logits): the request's temperature
    # as sent (None: absent) and the engine's logits dtype. The stand-in sets both and samples at temperature 1.
    kernel_temperature: Optional[float] = None
    logits_dtype: Optional[str] = None  # None: the logits as the model computed them (library use, tests)

    def logits(self, raw: torch.Tensor) -> torch.Tensor:
        """The logits tokens are chosen from."""
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
    logits: list[torch.Tensor] = field(default_factory=list)  # raw logits per generated token (if asked)
    cancelled: bool = False  # stopped early by should_stop
    # What the executor's RequestPerfMetrics report (time.monotonic_ns, a steady clock like theirs); 0 = not yet.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    reused_tokens: int = 0  # prompt positions whose K/V came from the prefix cache
    # an EAGLE engine's speculative steps, (drafted, accepted) each (in process only: the backend reports totals)
    rounds: list[tuple[int, int]] = field(default_factory=list)
    # an EAGLE engine's rounds as its draft-length policy chose them: drafts verified by a step, or 0 for a run of plain
    # decode steps without the head (the loop's LoopStats.draft_lengths; in process only)
    draft_lengths: list[int] = field(default_factory=list)

    def token_time(self) -> None:
        self.last_token_ns = time.monotonic_ns()
        self.first_token_ns = self.first_token_ns or self.last_token_ns


class ReferenceEngine:
    """One loaded model + its prefix cache. Calls run on a batching.BatchScheduler over it (a solo call is a
    one-request batch); `_compute` serializes forwards."""

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
        """numerics: the GPU-numerics mode (numerics.py): every verification forward's logits perturbed below its
        margin; None = exact. diverge_slack: set to the deployment's max draft length + 1 (how far a request's own
        rejected drafts can reach back). head: an EAGLE-3 head (eagle.py): every decode then speculates in the engine,
        max_draft_len tokens per step (a chain), as a TensorRT-LLM engine built with speculative_decoding_mode eagle.
        draft_policy: the chain's draft length, decided per step by the BLS loop's policy (records/draft_policy.py):
        "fixed" drafts and verifies max_draft_len every step; "adaptive" drafts k (0..max_draft_len) a step from
        the request's measured acceptance and the engine's costs, k = 0 being runs of plain decode steps that leave
        the head idle ("confidence", what engines exported earlier say, reads as adaptive: speculation.
        DEPRECATED_POLICIES). The adaptive costs start from DraftCosts (measured at load unless `draft_costs` is given)
        and follow what serving measures with `clock`."""
        self.model = model
        self.head = head
        self.max_draft_len = max_draft_len if head is not None else 0
        self.draft_policy = engine_policy(draft_policy)
        self.clock = clock
        self.policy: Optional[DraftLengthPolicy] = None  # the chain's policy: its costs, shared by the requests
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

    def verification_logits(self, logits: torch.Tensor, context: Sequence[int]) -> torch.Tensor:
        """A verification forward's logits [k + 1, V] as the accept rule sees them: exact, or perturbed in the
        GPU-numerics mode (context: the fed sequence, prompt + drafts)."""
        return logits if self.numerics is None else self.numerics.perturb(logits, context)

    # -- cache plumbing ---------------------------------------------------------------------------------
    def _copy_prefix(self, entry: CacheEntry, n: int, capacity: int) -> CacheEntry:
        """A new entry of `capacity` positions holding the first n positions of `entry`."""
        fresh = self.model.new_cache(1, max(capacity, n + 1))
        for src, dst in ((entry.cache.k, fresh.k), (entry.cache.v, fresh.v)):
            for s, d in zip(src, dst):
                d[:, :, :n] = s[:, :, :n]
        head = entry.head.copy(max(n - 1, 0), max(capacity, n + 1)) if entry.head is not None else None
        return CacheEntry(list(entry.tokens[:n]), fresh, head)

    def _acquire(self, tokens: Sequence[int], need: int) -> CacheEntry:
        """An entry valid for a prefix of `tokens` (never all of it: the last token is always re-fed) with
        capacity >= need positions."""
        cap = min(self.max_seq_len + 1, -(-need // CAPACITY_STEP) * CAPACITY_STEP)
        entry, n = self.prefix_cache.take(tokens, lambda e, m: self._copy_prefix(e, m, cap), self.slack)
        n = min(n, len(tokens) - 1)
        if entry is None:
            entry, n = CacheEntry([], self.model.new_cache(1, cap)), 0
        elif entry.capacity < need:  # grow: copy the valid prefix into a bigger cache
            entry = self._copy_prefix(entry, n, max(cap, need))
        if self.head is not None:  # the head's slots must cover the reused prefix: re-feed from its first stale slot
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


# The adaptive chain stops drafting when the head's own estimate that its next draft is accepted (the product of its
# probabilities along the chain, EAGLE-2's signal) falls below this: the policy's k is the most a step drafts.
STOP_CONFIDENCE = 0.05


@dataclass(frozen=True)
class DraftCosts:
    """An EAGLE engine's costs measured at load, in seconds: forward_s[n - 1] = a forward feeding n tokens (n = 1..k +
    1: a decode step, then verifications of 1..k drafts), head_s = one head step (one draft). On a GPU at small batch
    a verification costs about a decode step; on a CPU well above one."""

    forward_s: tuple[float, ...]
    head_s: float

    def seed(self, costs: CostModel) -> None:
        """The policy's starting costs at load level 1 (what serving measures takes over): V(n) for n = 2..k + 1, D(k)
        = k head steps, one decode step."""
        k = len(self.forward_s) - 1
        costs.seed(
            {n: self.forward_s[n - 1] for n in range(2, k + 2)},
            {d: d * self.head_s for d in range(1, k + 1)},
            self.forward_s[0],
        )


def measure_draft_costs(
    model: ReferenceModel, head: Eagle3Head, k: int, repeats: int = 3, clock: Callable[[], float] = time.perf_counter
) -> DraftCosts:
    """Time forwards of 1..k + 1 tokens on a scratch cache, and head steps (median of repeats)."""
    from .eagle import HeadState, head_step

    def median(f) -> float:
        ts = []
        for _ in range(repeats + 1):  # the first run warms up
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
    """One verification: logits [k + 1, V] of the target after x_last, d1..dk -> (accepted drafts + one target
    token, number accepted). Both logits go through the kernel's transform first (Sampling.logits)."""
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
    """A verification's tokens up to, not including, the end token (backend_contract.EOS_EXCLUDED)."""
    new = list(new)
    if end_id is not None and end_id in new:
        new = new[: new.index(end_id)]
    return new, min(accepted, len(new))


def _ends_with_stop(tokens: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    return any(len(sw) and list(tokens[-len(sw) :]) == list(sw) for sw in stop_words)
