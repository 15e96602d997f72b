"""In-flight batching for the reference engine: one engine thread packs many sequences into each forward.

Each iteration drops cancelled sequences, admits queued ones FCFS while slots are free, schedules up to
max_num_tokens (generation steps first, then contexts, chunked or whole), runs one forward_packed, and completes
the sequences whose pending tokens are all fed. Prefill and verify rows are bit-identical to a solo forward; batched
decode rows may differ in the last bits (oneDNN vs MKL gemv), which can flip a greedy near-tie. In GPU-numerics mode
a step's rows are perturbed iff it ran in the context phase (ReferenceEngine.step_logits).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from ..errors import TrtSpecError
from ..records.backend_contract import QUEUE_FULL
from ..records.draft_policy import Decision, Outcome, RequestPolicy
from .eagle import head_step
from .engine import (
    STOP_CONFIDENCE,
    CacheEntry,
    CallResult,
    ReferenceEngine,
    Sampling,
    _ends_with_stop,
    accept_draft,
    cut_at_end,
)
from .sampling import select


class QueueFullError(TrtSpecError, RuntimeError):
    """submit() while `max_queue_size` requests are already waiting for a slot."""


class EngineClosedError(TrtSpecError, RuntimeError):
    """The scheduler was closed before the request finished."""


class Handle:
    """A submitted request; `cancel()` resolves it normally with the tokens so far and `cancelled=True`."""

    def __init__(self, scheduler: BatchScheduler):
        self.future: Future[CallResult] = Future()
        self._scheduler = scheduler
        self.cancel_requested = False
        self.progress = CallResult()  # grows on the engine thread

    def result(self, timeout: Optional[float] = None) -> CallResult:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        self.cancel_requested = True
        self._scheduler._wake()


@dataclass
class _Seq:
    handle: Handle
    input_ids: list[int]
    sampling: Sampling
    order: int
    max_new: int = 0
    draft: Optional[list[int]] = None  # verify only
    draft_logits: Optional[torch.Tensor] = None
    end_id: Optional[int] = None
    stop_words: Sequence[Sequence[int]] = ()
    return_logits: bool = False
    on_token: Optional[Callable[[int], None]] = None
    on_tokens: Optional[Callable[[list[int]], None]] = None
    should_stop: Optional[Callable[[], bool]] = None
    entry: Optional[CacheEntry] = None
    pending: list[int] = field(default_factory=list)  # to feed before the next token is chosen
    need: int = 1  # logits rows needed: 1 (decode) or k + 1 (verify)
    steps: int = 0  # steps completed (0: the next is the context phase)
    fed: int = 0  # tokens fed in the current step, over its chunks
    rows: list[torch.Tensor] = field(default_factory=list)
    generator: Optional[torch.Generator] = None
    result: CallResult = field(default_factory=CallResult)
    # EAGLE decode: features fed since the head last ran, and the drafts in flight
    feats: list[torch.Tensor] = field(default_factory=list)
    feat_pos: int = 0
    spec_draft: list[int] = field(default_factory=list)
    spec_logits: Optional[torch.Tensor] = None
    # draft-length policy; a round is one k > 0 step or a run of plain decode steps
    policy: Optional[RequestPolicy] = None
    decision: Optional[Decision] = None
    run_left: int = 0
    round_tokens: int = 0
    round_s: float = 0.0
    head_s: float = 0.0

    @property
    def in_context(self) -> bool:
        return len(self.pending) > self.need


@dataclass(frozen=True)
class IterationStats:
    sequences: int
    tokens: int
    active: int
    waiting: int
    seconds: float


@dataclass(frozen=True)
class RequestCounts:
    """The executor's request counts as backend_contract.REQUEST_METRICS publishes them."""

    active: int
    max: int
    scheduled: int
    context: int

    @property
    def waiting(self) -> int:
        return self.active - self.scheduled

    def as_labels(self) -> dict[str, int]:
        return {
            "active": self.active,
            "max": self.max,
            "scheduled": self.scheduled,
            "context": self.context,
            "waiting": self.waiting,
        }


class BatchScheduler:
    """In-flight batching over a ReferenceEngine's model and PrefixCache."""

    def __init__(
        self,
        engine: ReferenceEngine,
        *,
        max_batch_size: int = 8,
        max_num_tokens: int = 2048,
        max_queue_size: Optional[int] = None,
        chunked_context: bool = True,
        stats_window: int = 4096,
        on_iteration: Optional[Callable[[], None]] = None,
    ):
        """on_iteration runs on the engine thread before each busy iteration; its exceptions are ignored."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be >= 1, got {max_num_tokens}")
        if max_queue_size is not None and max_queue_size < 0:
            raise ValueError(f"max_queue_size must be >= 0 or None (unbounded), got {max_queue_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_queue_size = max_queue_size
        self.chunked_context = chunked_context
        self.on_iteration = on_iteration
        self.stats: deque[IterationStats] = deque(maxlen=stats_window)
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._last_plan = (0, 0)  # (sequences, in context)
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="reference-batch-engine", daemon=True)
        self._thread.start()

    def submit_generate(
        self,
        input_ids: Sequence[int],
        max_new: int,
        sampling: Sampling,
        *,
        end_id: Optional[int] = None,
        stop_words: Sequence[Sequence[int]] = (),
        return_logits: bool = False,
        on_token: Optional[Callable[[int], None]] = None,
        should_stop: Optional[Callable[[], bool]] = None,
        on_tokens: Optional[Callable[[list[int]], None]] = None,
    ) -> Handle:
        """Decode up to max_new tokens; end_id is not output, a stop word is. Callbacks run on the engine thread."""
        self._check(input_ids, max_new, 0)
        return self._submit(
            _Seq(
                Handle(self),
                list(input_ids),
                sampling,
                0,
                max_new=max_new,
                end_id=end_id,
                stop_words=[list(w) for w in stop_words],
                return_logits=return_logits,
                on_token=on_token,
                on_tokens=on_tokens,
                should_stop=should_stop,
            )
        )

    def submit_verify(
        self,
        input_ids: Sequence[int],
        draft: Sequence[int],
        sampling: Sampling,
        *,
        draft_logits: Optional[torch.Tensor] = None,
        end_id: Optional[int] = None,
    ) -> Handle:
        """One target forward over the draft: its accepted prefix + one target token."""
        self._check(input_ids, len(draft) + 1, len(draft))
        return self._submit(
            _Seq(
                Handle(self),
                list(input_ids),
                sampling,
                0,
                draft=list(draft),
                draft_logits=draft_logits,
                end_id=end_id,
                need=len(draft) + 1,
            )
        )

    def close(self, timeout: Optional[float] = None) -> None:
        """Stop the engine thread; requests not finished resolve with EngineClosedError."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, input_ids: Sequence[int], new: int, extra_fed: int) -> None:
        self.engine._check_len(input_ids, new)
        if not self.chunked_context and len(input_ids) + extra_fed > self.max_num_tokens:
            raise ValueError(
                f"input ({len(input_ids)} tokens) + draft ({extra_fed}) exceeds max_num_tokens "
                f"{self.max_num_tokens}; without chunked context a context runs in one iteration"
            )

    def _submit(self, seq: _Seq) -> Handle:
        seq.handle.progress = seq.result
        with self._cv:
            if self._closed:
                raise EngineClosedError("the batch scheduler is closed")
            if self.max_queue_size is not None and len(self._waiting) >= self.max_queue_size:
                raise QueueFullError(QUEUE_FULL.format(max=self.max_queue_size))
            seq.order = next(self._order)
            self._waiting.append(seq)
            self._cv.notify_all()
        return seq.handle

    def request_counts(self) -> RequestCounts:
        """Current request counts (any thread)."""
        with self._cv:
            active = len(self._active)
            scheduled, context = self._last_plan if active else (0, 0)
        return RequestCounts(active, self.max_batch_size, min(scheduled, active), min(context, active))

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            if self.on_iteration is not None:
                try:
                    self.on_iteration()
                except Exception:  # noqa: BLE001 - a failing hook must not stop the engine
                    pass
            with self._cv:
                while not self._closed and not self._waiting and not self._active:
                    self._cv.wait()
                if self._closed:
                    break
                dropped = [s for s in self._waiting if s.handle.cancel_requested]
                for seq in dropped:
                    self._waiting.remove(seq)
                admitted = []
                while self._waiting and len(self._active) + len(admitted) < self.max_batch_size:
                    admitted.append(self._waiting.popleft())
                waiting = len(self._waiting)
            for seq in dropped:
                seq.result.cancelled = True
                self._release(seq)
            for seq in admitted:
                self._admit(seq)
            self._iteration(waiting)
        err = EngineClosedError("the batch scheduler was closed before the request finished")
        for seq in [*self._active, *self._waiting]:
            self._release(seq, error=err)
        self._active.clear()
        self._waiting.clear()

    def _admit(self, seq: _Seq) -> None:
        if seq.handle.cancel_requested:
            seq.result.cancelled = True
            self._release(seq)
            return
        if seq.draft is None and seq.max_new < 1:
            self._release(seq)
            return
        try:
            k = len(seq.draft) if seq.draft is not None else self.engine.max_draft_len
            need = len(seq.input_ids) + (k + 1 if seq.draft is not None else seq.max_new + k)
            seq.entry = self.engine._acquire(seq.input_ids, need)
            seq.feat_pos = len(seq.entry.tokens)
            seq.result.scheduled_ns, seq.result.reused_tokens = time.monotonic_ns(), len(seq.entry.tokens)
            seq.pending = seq.input_ids[len(seq.entry.tokens) :] + (seq.draft or [])
            if seq.draft is None:
                seq.generator = seq.sampling.generator()
                if self.engine.policy is not None:
                    seq.policy = self.engine.policy.start()
            else:
                seq.result.drafted = k
        except Exception as e:  # noqa: BLE001 - the request fails alone
            self._release(seq, error=e)
            return
        self._active.append(seq)

    def _iteration(self, waiting: int) -> None:
        for seq in [s for s in self._active if s.handle.cancel_requested]:
            seq.result.cancelled = True
            self._finish(seq)
        plan = self._schedule()
        self._last_plan = (len(plan), sum(1 for seq, _ in plan if seq.in_context))
        if not plan:
            return
        tokens: list[int] = []
        positions: list[int] = []
        logits_at: list[int] = []
        segments = []
        for seq, n in plan:
            start = len(seq.entry.tokens)
            first_needed = len(seq.pending) - seq.need
            logits_at += [len(tokens) + j for j in range(max(first_needed, 0), n)]
            tokens += seq.pending[:n]
            positions += range(start, start + n)
            segments.append((seq.entry.cache, n))
        clock = self.engine.clock
        t0 = clock()
        head = self.engine.head
        try:
            with self.engine._compute:
                args = (
                    torch.tensor(tokens, dtype=torch.long),
                    torch.tensor(positions, dtype=torch.long),
                    segments,
                    torch.tensor(logits_at, dtype=torch.long),
                )
                if head is None:
                    logits = self.engine.model.forward_packed(*args)
                else:
                    logits, feats = self.engine.model.forward_packed(*args, aux_layers=head.cfg.aux_layers)
        except Exception as e:  # noqa: BLE001 - fail the sequences in this forward, keep serving the rest
            for seq, _ in plan:
                self._finish(seq, error=e)
            return
        seconds = clock() - t0
        self.stats.append(IterationStats(len(plan), len(tokens), len(self._active), waiting, seconds))
        row = fed = 0
        for seq, n in plan:
            seq.round_s += seconds  # the step waits for the whole forward
            first_needed = len(seq.pending) - seq.need
            m = n - max(first_needed, 0)
            if m > 0:
                seq.rows.append(logits[row : row + m])
                row += m
            if head is not None:
                seq.feats.append(feats[fed : fed + n])
            fed += n
            seq.fed += n
            seq.entry.tokens.extend(seq.pending[:n])
            del seq.pending[:n]
            if not seq.pending:
                try:
                    self._complete_step(seq)
                except Exception as e:  # noqa: BLE001 - a failing callback fails its own request only
                    self._finish(seq, error=e)

    def _schedule(self) -> list[tuple[_Seq, int]]:
        """(sequence, tokens to feed) within max_num_tokens: generation steps first, then contexts FCFS."""
        budget = self.max_num_tokens
        plan = []
        for seq in sorted(self._active, key=lambda s: (s.in_context, s.order)):
            want = len(seq.pending)
            if budget <= 0 or (want > budget and not self.chunked_context):
                break  # nothing behind a waiting context jumps ahead of it
            n = min(want, budget)
            plan.append((seq, n))
            budget -= n
        return plan

    def _complete_step(self, seq: _Seq) -> None:
        logits = torch.cat(seq.rows) if len(seq.rows) > 1 else seq.rows[0]
        # the one place a step's logits become what the request sees (GPU-numerics mode: context phase perturbed)
        logits = self.engine.step_logits(logits, seq.entry.tokens, first_step=not seq.steps, fed=seq.fed)
        seq.rows, seq.steps, seq.fed = [], seq.steps + 1, 0
        res = seq.result
        if seq.draft is not None:
            self._complete_verify(seq, logits)
            return
        if self.engine.head is not None:
            self._complete_eagle(seq, logits)
            return
        last = logits[-1]
        tok = int(
            select(
                seq.sampling.logits(last),
                seq.sampling.temperature,
                seq.sampling.top_k,
                seq.sampling.top_p,
                seq.generator,
            )[0]
        )
        if seq.return_logits:
            res.logits.append(last.clone())
        res.token_time()
        if tok == seq.end_id:  # not output (backend_contract.EOS_EXCLUDED)
            self._finish(seq)
            return
        res.tokens.append(tok)
        if seq.on_token is not None:
            seq.on_token(tok)
        if seq.on_tokens is not None:
            seq.on_tokens([tok])
        if _ends_with_stop(res.tokens, seq.stop_words):
            self._finish(seq)
        elif seq.should_stop is not None and seq.should_stop():
            res.cancelled = True
            self._finish(seq)
        elif len(res.tokens) >= seq.max_new:
            self._finish(seq)
        else:
            seq.pending = [tok]

    def _complete_eagle(self, seq: _Seq, logits: torch.Tensor) -> None:
        """Accept the drafts in flight, output the new tokens, account the round, then draft the next step."""
        res, sampling = seq.result, seq.sampling
        k = len(seq.spec_draft)
        accepted = 0
        if k:
            new, accepted = accept_draft(seq.spec_draft, seq.spec_logits, logits, sampling)
            seq.entry.tokens = seq.entry.tokens[: len(seq.entry.tokens) - (k - accepted)]
            res.drafted += k
            res.accepted += accepted
            res.rounds.append((k, accepted))
        else:
            new = [
                int(
                    select(
                        sampling.logits(logits[-1]), sampling.temperature, sampling.top_k, sampling.top_p, seq.generator
                    )[0]
                )
            ]
        res.token_time()
        out: list[int] = []
        done = False
        for i, tok in enumerate(new):
            if tok == seq.end_id:
                done = True
                break
            out.append(tok)
            res.tokens.append(tok)
            if seq.return_logits:
                res.logits.append(logits[i if k else -1].clone())
            if _ends_with_stop(res.tokens, seq.stop_words) or len(res.tokens) >= seq.max_new:
                done = True
                break
        if out and seq.on_token is not None:
            for tok in out:
                seq.on_token(tok)
        if out and seq.on_tokens is not None:
            seq.on_tokens(out)
        if not done and seq.should_stop is not None and seq.should_stop():
            res.cancelled = done = True
        self._observe(seq, k, accepted, len(new), done)
        if done:
            self._finish(seq)
            return
        self._draft_next(seq)

    def _observe(self, seq: _Seq, k: int, accepted: int, tokens: int, done: bool) -> None:
        """Add a step to its round; when the round ends the policy observes its yield and cost."""
        if seq.decision is None:
            return
        seq.round_tokens += tokens
        if not k:
            seq.run_left -= 1
            if seq.run_left > 0 and not done:
                return
        seq.policy.observe(
            seq.decision, Outcome(k, accepted, seq.round_tokens, seq.head_s, seq.round_s), draft_free=False
        )
        seq.result.draft_lengths.append(k)
        seq.decision, seq.run_left = None, 0

    def _draft_next(self, seq: _Seq) -> None:
        """Set up the next step: a plain decode (head idle) or a chain of k drafts to verify in the next forward."""
        res = seq.result
        full = seq.input_ids + res.tokens
        start, end = seq.feat_pos, len(seq.entry.tokens)
        _keep_rows(seq.feats, end - start)  # rows past `end` were rejected drafts
        k = self._decide(seq, len(full)) if seq.run_left <= 0 else 0
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        if k:
            t0 = self.engine.clock()
            drafts, rows = self._chain(seq, full, start, end, k)
            seq.head_s = self.engine.clock() - t0
        seq.spec_draft = drafts
        seq.spec_logits = torch.stack(rows) if rows else None
        seq.pending = [full[-1], *drafts]
        seq.need = len(drafts) + 1

    def _decide(self, seq: _Seq, length: int) -> int:
        """Drafts for the next round, or 0 for a run of plain decode steps; capped by budget and cache room."""
        entry, left = seq.entry, seq.max_new - len(seq.result.tokens)
        room = min(entry.capacity, entry.head.capacity) - length - 1
        cap = max(0, min(self.engine.max_draft_len, left - 1, room))
        d = seq.policy.decide(cap, len(self._active), left, draft_free=False)
        seq.decision, seq.round_tokens, seq.round_s, seq.head_s = d, 0, 0.0, 0.0
        k = d.k if d.speculate else 0
        seq.run_left = 0 if k else d.run_len
        return k

    def _chain(self, seq: _Seq, full: list[int], start: int, end: int, k: int) -> tuple[list[int], list[torch.Tensor]]:
        """Catch the head up, then draft up to k tokens (with target-vocab logits when sampling).

        Adaptive policies stop once the product of the head's draft probabilities falls below STOP_CONFIDENCE."""
        head, entry, sampling = self.engine.head, seq.entry, seq.sampling
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        p = 1.0
        with torch.inference_mode():
            embed = self.engine.model.embed
            g = self._feed_head(seq, full, start, end)[-1:]
            for i in range(k):
                dl = head.logits(g[0])
                if sampling.temperature > 0:
                    full_logits = head.to_target(dl)
                    d = int(
                        select(
                            sampling.logits(full_logits),
                            sampling.temperature,
                            sampling.top_k,
                            sampling.top_p,
                            seq.generator,
                        )[0]
                    )
                    rows.append(full_logits)
                else:
                    d = int(head.target_ids[int(dl.argmax())])
                drafts.append(d)
                if seq.policy.adaptive:
                    p *= float(torch.softmax(dl.float(), -1)[head.draft_index(d)])
                if i + 1 == k or p < STOP_CONFIDENCE:
                    break
                g = head_step(head, entry.head, end + i, g, embed[torch.tensor([d])])
        return drafts, rows

    def _complete_verify(self, seq: _Seq, logits: torch.Tensor) -> None:
        k = len(seq.draft)
        new, accepted = accept_draft(seq.draft, seq.draft_logits, logits, seq.sampling)
        # rejected drafts' K/V stay past the valid length and are overwritten later
        seq.entry.tokens = seq.entry.tokens[: len(seq.entry.tokens) - (k - accepted)]
        seq.result.tokens, seq.result.accepted = cut_at_end(new, accepted, seq.end_id)
        seq.result.token_time()
        self._finish(seq)

    def _finish(self, seq: _Seq, error: Optional[BaseException] = None) -> None:
        if seq in self._active:
            self._active.remove(seq)
        self._release(seq, error)

    def _release(self, seq: _Seq, error: Optional[BaseException] = None) -> None:
        """Answer the request, then return its cache entry to the prefix cache (head caught up first)."""
        if not seq.handle.future.done():
            if error is not None:
                seq.handle.future.set_exception(error)
            else:
                seq.handle.future.set_result(seq.result)
        if seq.entry is not None:
            if error is None and seq.feats and self.engine.head is not None:
                self._catch_up_head(seq)
            self.engine.prefix_cache.put(seq.entry)
            seq.entry = None

    def _catch_up_head(self, seq: _Seq) -> None:
        """Fill the head's stale slots so the cached entry is valid for the head as far as for the target.

        Otherwise the next request on this prefix would re-feed the target from the head's first stale slot."""
        entry = seq.entry
        full = seq.input_ids + seq.result.tokens
        start = seq.feat_pos
        end = min(len(entry.tokens), len(full) - 1, entry.head.capacity)  # slot i needs token i + 1
        if end <= start:
            return
        _keep_rows(seq.feats, len(entry.tokens) - start)
        with torch.inference_mode():
            self._feed_head(seq, full, start, end)

    def _feed_head(self, seq: _Seq, full: list[int], start: int, end: int) -> torch.Tensor:
        """One head step over slots start..end-1, consuming the waiting features; returns the head outputs."""
        head, entry = self.engine.head, seq.entry
        feats = torch.cat(seq.feats)[: end - start]
        seq.feats, seq.feat_pos = [], end
        h = head_step(
            head, entry.head, start, head.fc(feats), self.engine.model.embed[torch.tensor(full[start + 1 : end + 1])]
        )
        entry.head.tokens = list(full[: end + 1])
        return h


def _keep_rows(chunks: list[torch.Tensor], n: int) -> None:
    """Cut a list of row chunks to its first n rows, in place."""
    extra = sum(c.shape[0] for c in chunks) - n
    while extra > 0:
        last = chunks.pop()
        if last.shape[0] > extra:
            chunks.append(last[: last.shape[0] - extra])
        extra -= last.shape[0]
