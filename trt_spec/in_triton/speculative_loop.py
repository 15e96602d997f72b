"""The `tensorrt_llm_bls` model's speculative loop, free of Triton: the BLS runs `generate` with an `EngineCall`.

Loop modes resend the whole sequence every round (the engine reuses its cached prefix); in-engine modes make one
engine call. Sampling inputs are sent only when the client sent them (upstream-facts: trtllm-absent-sampling-greedy).
NVIDIA's own BLS is split the same way (upstream-facts: trtllm-bls-split-decode).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from ..errors import TrtSpecError
from ..records import backend_contract as bc
from ..records import defaults
from ..records.bls_parameters import BlsParameters
from ..records.draft_policy import DraftLengthPolicy, Outcome
from ..records.names import DRAFT_LEN_POLICY, MAX_TOKENS, NUM_DRAFT_TOKENS, TENANT, TEXT_INPUT
from ..records.speculation import LOOP_MODES, POLICIES, CacheScope
from .proposers import SuffixCache, proposer_for

SEED_STRIDE = 1_000_003  # per-round seed offset: independent random streams across verify calls


class RequestError(TrtSpecError, ValueError):
    """A bad request, reported to the client as one line."""


class EngineError(TrtSpecError, RuntimeError):
    """An engine model answered a call with an error."""


class Cancelled(TrtSpecError):
    """The client cancelled the request or went away."""


class EngineCall(Protocol):
    async def __call__(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        outputs: Sequence[str],
        on_response: Optional[Callable[[dict[str, np.ndarray]], None]] = None,
    ) -> list[dict[str, np.ndarray]]:
        """Send one request; return every response's outputs (on_response sees each). Raises EngineError."""


@dataclass
class SpecRequest:
    prompt: list[int]
    max_tokens: int
    k: int
    end_id: int
    pad_id: int
    stream: bool = False
    sampling: dict[str, np.ndarray] = field(default_factory=dict)  # only those the client sent
    seed: Optional[int] = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    use_logits: bool = False
    draft_len_policy: Optional[str] = None  # None: the deployment's
    perf: bool = False  # the client's return_perf_metrics
    tenant: Optional[str] = None


@dataclass(frozen=True)
class Round:
    """One round of the loop (one target call): what the policy chose and what it cost."""

    k: int  # 0 = a round without speculation
    drafted: int  # a proposer may offer fewer than k
    accepted: int
    tokens: int  # added to the output
    draft_s: float
    target_s: float
    cached: bool = False  # the proposal drew on the cross-request suffix cache
    call_s: float = 0.0  # of target_s, the engine call alone (records/profile.py: the rest is the loop's own work)


@dataclass
class EnginePerf:
    """The backend's perf outputs over every engine call of one BLS request.

    KV-cache blocks are summed; arrival and first-scheduled times are the first call's; token times the target's."""

    total: bc.PerfOutputs = field(default_factory=bc.PerfOutputs)  # acceptance fields stay 0: LoopStats has them

    def add(self, responses: Sequence[dict[str, np.ndarray]], *, output: bool) -> None:
        """Add one engine call (its last response holds the totals); output: a target call, not a draft call."""
        out = next((o for o in reversed(responses) if "kv_cache_alloc_total_blocks" in o), None)
        if out is None:
            return
        v = {
            k: int(np.asarray(out[k]).reshape(-1)[0])
            for k in (
                "kv_cache_alloc_new_blocks",
                "kv_cache_reused_blocks",
                "kv_cache_alloc_total_blocks",
                "arrival_time_ns",
                "first_scheduled_time_ns",
                "first_token_time_ns",
                "last_token_time_ns",
            )
        }
        t = self.total
        self.total = replace(
            t,
            kv_new_blocks=t.kv_new_blocks + v["kv_cache_alloc_new_blocks"],
            kv_reused_blocks=t.kv_reused_blocks + v["kv_cache_reused_blocks"],
            kv_total_blocks=t.kv_total_blocks + v["kv_cache_alloc_total_blocks"],
            arrival_ns=t.arrival_ns or v["arrival_time_ns"],
            first_scheduled_ns=t.first_scheduled_ns or v["first_scheduled_time_ns"],
            first_token_ns=(t.first_token_ns or v["first_token_time_ns"]) if output else t.first_token_ns,
            last_token_ns=(v["last_token_time_ns"] or t.last_token_ns) if output else t.last_token_ns,
        )


@dataclass
class LoopStats:
    """One request's counters, as the response reports them and the metrics publish them."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    # rounds (loop modes) or verify steps (in-engine) by accepted count; empty when the engine does not show steps
    hist: list[int] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)  # loop modes: one per target call
    engine: EnginePerf = field(default_factory=EnginePerf)
    cache_tokens: Optional[int] = None  # suffix cache size after this request (None: off)

    def perf_outputs(self) -> dict[str, np.ndarray]:
        """The BLS's perf outputs ([1, 1] each) for the request so far."""
        return replace(self.engine.total, accepted=self.accepted, drafted=self.drafted).tensors()

    @property
    def draft_lengths(self) -> list[int]:
        return [r.k for r in self.rounds]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def cache_accepted(self) -> int:
        """Accepted draft tokens of rounds whose proposal drew on the cross-request cache (Round.cached)."""
        return sum(r.accepted for r in self.rounds if r.cached)


def check_prompt_len(prompt_len: int, max_input_len: int) -> None:
    """The deployment's prompt limit, shared by preprocessing and the BLS."""
    if prompt_len > max_input_len:
        raise RequestError(
            f"prompt is {prompt_len} tokens, more than max_input_len {max_input_len}; shorten it "
            "(or rebuild with a larger limits.max_input_len)"
        )


def validate(
    cfg: BlsParameters, prompt_len: int, max_tokens: int, k: int, use_logits: bool, policy: Optional[str] = None
) -> None:
    """Request checks before any engine call; raises RequestError."""
    if prompt_len == 0:
        raise RequestError(f"{TEXT_INPUT} is empty; send a non-empty prompt")
    if max_tokens <= 0:
        raise RequestError(f"{MAX_TOKENS} must be >= 1, got {max_tokens}")
    if cfg.max_input_len is not None:
        check_prompt_len(prompt_len, cfg.max_input_len)
    # The executor would silently shorten the output (backend_contract.OUTPUT_LEN_CLAMPED).
    if prompt_len + max_tokens + cfg.max_draft_len > cfg.max_seq_len:
        raise RequestError(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) + max_draft_len "
            f"({cfg.max_draft_len}) exceeds max_seq_len {cfg.max_seq_len}; lower max_tokens to at most "
            f"{max(0, cfg.max_seq_len - prompt_len - cfg.max_draft_len)}"
        )
    # Loop modes resend the sequence; the last round's input is prompt + max_tokens - 1.
    longest = prompt_len + max_tokens - 1 if cfg.speculative_mode in LOOP_MODES else prompt_len
    if longest > cfg.engine_input_limit:
        what = "prompt + max_tokens - 1" if cfg.speculative_mode in LOOP_MODES else "prompt"
        raise RequestError(
            f"{what} ({longest} tokens) exceeds the engine's input limit {cfg.engine_input_limit} "
            "(min(max_seq_len - 1, max_num_tokens)); the speculative loop resends the whole sequence "
            "every round, so lower max_tokens or shorten the prompt"
        )
    if not 0 <= k <= cfg.max_draft_len:
        raise RequestError(
            f"{NUM_DRAFT_TOKENS} {k} is outside 0..max_draft_len ({cfg.max_draft_len}); the engine "
            "was built for at most max_draft_len draft tokens"
        )
    if policy is not None and policy not in POLICIES:
        raise RequestError(
            f"{DRAFT_LEN_POLICY} {policy!r} is not one of {', '.join(POLICIES)}; send one or omit it "
            f"(the deployment's default: {cfg.draft_len_policy})"
        )
    if use_logits and cfg.speculative_mode != "draft_target":
        raise RequestError("use_draft_logits needs draft-target mode (this deployment has no draft model)")


def check_tenant(tenant: Optional[str]) -> Optional[str]:
    """A request's tenant id (None if empty); raises RequestError beyond TENANT_MAX_BYTES."""
    if not tenant:
        return None
    size = len(tenant.encode("utf-8"))
    if size > defaults.TENANT_MAX_BYTES:
        raise RequestError(
            f"{TENANT} is {size} bytes, more than {defaults.TENANT_MAX_BYTES}; send a shorter id (a hash of it will do)"
        )
    return tenant


def check_sampling(
    *,
    temperature: Optional[float],
    top_k: Optional[int],
    top_p: Optional[float],
    seed: Optional[int],
    end_id: int,
    pad_id: int,
    vocab_size: int,
) -> None:
    """Sampling and token-id checks naming the client's inputs (the engine's would name its own tensors)."""
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise RequestError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise RequestError(f"top_k must be >= 0 (0 = no top-k limit), got {top_k}")
    if top_p is not None and not (math.isfinite(top_p) and 0 <= top_p <= 1):
        raise RequestError(f"top_p must be in [0, 1], got {top_p}")
    if seed is not None and not 0 <= seed < 2**64:
        raise RequestError(f"seed must be in 0..2^64-1, got {seed}")
    if not -1 <= end_id < vocab_size:
        raise RequestError(f"end_id {end_id} is outside the vocabulary [0, {vocab_size}) (-1: never stop on EOS)")
    if not 0 <= pad_id < vocab_size:
        raise RequestError(f"pad_id {pad_id} is outside the vocabulary [0, {vocab_size})")


def engine_inputs(
    r: SpecRequest, tokens: Sequence[int], out_len: int, seed_offset: int, *, streaming: bool = False
) -> dict[str, np.ndarray]:
    """One engine request's tensors, batch dimension first."""
    ins = {
        bc.INPUT_IDS: np.asarray([list(tokens)], dtype=np.int32),
        bc.INPUT_LENGTHS: np.asarray([[len(tokens)]], dtype=np.int32),
        bc.REQUEST_OUTPUT_LEN: np.asarray([[out_len]], dtype=np.int32),
        bc.END_ID: np.asarray([[r.end_id]], dtype=np.int32),
        bc.PAD_ID: np.asarray([[r.pad_id]], dtype=np.int32),
        bc.STREAMING: np.asarray([[streaming]], dtype=bool),
        bc.EXCLUDE_INPUT_IN_OUTPUT: np.asarray([[True]], dtype=bool),
        **r.sampling,
    }
    if r.seed is not None:
        ins[bc.SEED] = np.asarray([[(r.seed + seed_offset) % 2**63]], dtype=np.uint64)
    if r.perf:  # the backend writes its perf outputs only when asked
        ins[bc.RETURN_PERF_METRICS] = np.asarray([[True]], dtype=bool)
    if r.bad_words:
        ins[bc.BAD_WORDS_LIST] = bc.word_list_array(r.bad_words)[None]
    return ins


def response_tokens(out: dict[str, np.ndarray]) -> list[int]:
    """New tokens of one response: output_ids [1, 1, T] cut to sequence_length [1, 1]."""
    ids = np.asarray(out[bc.OUTPUT_IDS]).reshape(-1)
    n = int(np.asarray(out[bc.SEQUENCE_LENGTH]).reshape(-1)[0])
    return [int(x) for x in ids[:n]]


def round_ended(draft: Sequence[int], new: Sequence[int], out_len: int) -> bool:
    """Whether the target stopped at the end token, which the engine does not output (backend_contract.EOS_EXCLUDED).

    Only such a round returns fewer than out_len decode tokens, or nothing but a prefix of the draft."""
    if not draft:
        return len(new) < out_len
    return len(new) <= len(draft) and list(new) == list(draft[: len(new)])


def find_stop(tokens: Sequence[int], stop_words: Sequence[Sequence[int]], start: int = 0) -> Optional[int]:
    """Index just past the first stop-word occurrence that ends at or after `start`, else None."""
    best = None
    for sw in stop_words:
        n = len(sw)
        if n == 0:
            continue
        for end in range(max(start, n), len(tokens) + 1):
            if list(tokens[end - n : end]) == list(sw):
                best = end if best is None else min(best, end)
                break
    return best


# -- In-engine modes: streamed, each response's change in the draft totals is one verify step
# (upstream-facts: trtllm-spec-totals-per-iteration, trtllm-stream-result-per-iteration). A non-streamed call, or a
# response holding several steps (tokens > accepted + 1), gives no histogram. Only the last response may hold fewer
# tokens than accepted + 1: the request's end cut its step after the engine counted it.


def engine_step_histogram(responses: Sequence[tuple[int, int, int]], k: int, streamed: bool) -> list[int]:
    """Verify steps by accepted draft count 0..k (k: max_draft_len), steps without drafts not counted
    (upstream-facts: vllm-spec-histogram-steps).

    responses: (tokens, total_draft_tokens, total_accepted_draft_tokens) per response, in order; [] when they do not
    show the steps one by one."""
    if not streamed:
        return []
    hist = [0] * (k + 1)
    drafted = accepted = 0
    for i, (tokens, d_total, a_total) in enumerate(responses):
        d, a = d_total - drafted, a_total - accepted
        drafted, accepted = d_total, a_total
        if d == 0 and a == 0:  # context step or no drafts
            continue
        last = i == len(responses) - 1
        if not 0 <= a <= min(d, k) or tokens > a + 1 or (tokens < a + 1 and not last):
            return []
        hist[a] += 1
    if sum(j * h for j, h in enumerate(hist)) != accepted:  # the invariant AIPerf checks
        return []
    return hist


class SpeculativeLoop:
    def __init__(
        self,
        cfg: BlsParameters,
        call: EngineCall,
        *,
        stream_engine: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """stream_engine: in-engine modes always stream their engine call, so every request gets its histogram.
        clock: what the policy's cost measurements read (a modelled clock in tests)."""
        self.cfg = cfg
        self.call = call
        self.stream_engine = stream_engine
        self.clock = clock
        self.policy = DraftLengthPolicy(cfg.draft_len_policy)  # shared costs; `active` = requests in the loop
        self.cache = None
        if cfg.speculative_mode == "ngram" and cfg.proposer == "suffix" and cfg.suffix_cache.scope != CacheScope.OFF:
            self.cache = SuffixCache(cfg.suffix_cache)
        if cfg.speculative_mode == "ngram":
            proposer_for(cfg)  # a proposer the parameters cannot make fails at load, not on a request

    async def generate(
        self,
        r: SpecRequest,
        emit: Callable[[list[int]], None],
        cancelled: Callable[[], bool] = lambda: False,
        metrics: Optional[LoopStats] = None,
    ) -> tuple[list[int], LoopStats]:
        """Generated tokens and metrics; `emit(new_tokens)` is called per accepted chunk.

        `cancelled()` is checked before every round (in-engine: at each response) and raises Cancelled; the engine
        request itself is cancelled only where the backend can (upstream-facts: python-backend-bls-cancel)."""
        m = metrics if metrics is not None else LoopStats()
        if self.cfg.speculative_mode == "engine":
            return await self._in_engine(r, emit, cancelled, m)
        self.policy.active += 1
        try:
            generated, m = await self._loop(r, emit, cancelled, m)
        finally:
            self.policy.active -= 1
        if self.cache is not None:  # only finished requests (not cancelled, no error)
            self.cache.add(r.tenant, [*r.prompt, *generated])
            m.cache_tokens = self.cache.num_tokens
        return generated, m

    async def _draft(
        self, r: SpecRequest, tokens: list[int], k: int, step: int, proposer, m: LoopStats
    ) -> tuple[list[int], Optional[np.ndarray], Optional[list]]:
        """(draft, its logits, its per-token evidence where the proposer gives it)."""
        if k <= 0:
            return [], None, None
        if proposer is not None:
            c = proposer.candidate(tokens, k, (r.end_id,))
            return c.tokens, None, c.evidence
        ins = engine_inputs(r, tokens, k, SEED_STRIDE * step + 1)
        outs = list(bc.MANDATORY_OUTPUTS) + (list(bc.PERF_OUTPUTS) if r.perf else [])
        if r.use_logits:
            ins[bc.RETURN_GENERATION_LOGITS] = np.asarray([[True]], dtype=bool)
            outs.append(bc.GENERATION_LOGITS)
        responses = await self.call(self.cfg.draft, ins, outs)
        m.engine.add(responses, output=False)
        draft = [t for out in responses for t in response_tokens(out)][:k]
        logits = next((o[bc.GENERATION_LOGITS] for o in responses if bc.GENERATION_LOGITS in o), None)
        if logits is not None:
            logits = np.asarray(logits, dtype=np.float32)
            logits = logits.reshape(-1, logits.shape[-1])[: len(draft)]
        return draft, logits, None

    def _proposer(self, r: SpecRequest):
        """The request's own draft-free proposer (ngram mode); None in draft-target mode."""
        if self.cfg.speculative_mode != "ngram":
            return None
        return proposer_for(self.cfg, self.cache.store(r.tenant) if self.cache is not None else None)

    async def _loop(
        self, r: SpecRequest, emit, cancelled: Callable[[], bool], m: LoopStats
    ) -> tuple[list[int], LoopStats]:
        tokens = list(r.prompt)
        generated: list[int] = []
        m.hist = [0] * (r.k + 1)
        policy = self.policy.start(r.draft_len_policy)
        proposer = self._proposer(r)
        draft_free = proposer is not None
        done = False
        while not done and len(generated) < r.max_tokens:
            if cancelled():
                raise Cancelled(f"request cancelled after {len(generated)} tokens")
            remaining = r.max_tokens - len(generated)
            cap = min(r.k, remaining - 1)
            decision = policy.decide(cap, self.policy.active, remaining, draft_free=draft_free, first=not generated)
            t0 = self.clock()
            k = decision.k if decision.speculate else 0
            draft, logits, evidence = await self._draft(r, tokens, k, m.steps, proposer, m)
            t1 = self.clock()
            empty = draft_free and not draft
            if draft_free:  # free to consult: decide on what it proposed (with evidence: how much of it)
                decision = policy.confirm(decision, len(draft), t1 - t0, evidence)
                draft = draft[: decision.keep] if decision.speculate else []
            # a run without speculation: one target call, one chunk to a streaming client
            out_len = len(draft) + 1 if draft else decision.run_len
            ins = engine_inputs(r, tokens, out_len, SEED_STRIDE * m.steps)
            if draft:
                ins[bc.DRAFT_INPUT_IDS] = np.asarray([draft], dtype=np.int32)
                if logits is not None:
                    ins[bc.DRAFT_LOGITS] = logits[None]
            t_call = self.clock()
            responses = await self.call(
                self.cfg.tensorrt_llm_model_name,
                ins,
                list(bc.MANDATORY_OUTPUTS) + (list(bc.PERF_OUTPUTS) if r.perf else []),
            )
            t2 = self.clock()
            m.engine.add(responses, output=True)
            new = [t for out in responses for t in response_tokens(out)][:remaining]
            acc = 0
            while acc < min(len(draft), len(new)) and new[acc] == draft[acc]:
                acc += 1
            k_used = decision.k if draft else 0
            outcome = Outcome(len(draft), acc, len(new), t1 - t0, t2 - t1, empty=empty, prefill=not generated)
            policy.observe(decision, outcome, draft_free=draft_free)
            cached = bool(draft) and getattr(proposer, "store_hit", False)
            m.rounds.append(Round(k_used, len(draft), acc, len(new), t1 - t0, t2 - t1, cached, t2 - t_call))
            m.steps += 1
            m.drafted += len(draft)
            m.accepted += acc
            if draft:
                m.hist[min(acc, r.k)] += 1
            # stop: end token (not output), stop words (kept), budget
            done = round_ended(draft, new, out_len)
            start = len(generated)
            generated += new
            cut = find_stop(generated, r.stop_words, start=start)
            if cut is not None:
                new = new[: cut - start]
                generated = generated[:cut]
                done = True
            tokens += new
            if new:
                emit(new)
        return generated, m

    async def _in_engine(
        self, r: SpecRequest, emit, cancelled: Callable[[], bool], m: LoopStats
    ) -> tuple[list[int], LoopStats]:
        streamed = r.stream or self.stream_engine
        ins = engine_inputs(r, r.prompt, r.max_tokens, 0, streaming=streamed)
        ins[bc.RETURN_PERF_METRICS] = np.asarray([[True]], dtype=bool)
        if r.stop_words:
            ins[bc.STOP_WORDS_LIST] = bc.word_list_array(r.stop_words)[None]
        generated: list[int] = []
        steps: list[tuple[int, int, int]] = []  # per response: tokens, drafted total, accepted total

        def on_response(out: dict[str, np.ndarray]) -> None:
            if cancelled():
                raise Cancelled(f"request cancelled after {len(generated)} tokens")
            new = response_tokens(out)
            generated.extend(new)
            if "total_draft_tokens" in out:
                m.drafted = int(np.asarray(out["total_draft_tokens"]).reshape(-1)[0])
                m.accepted = int(np.asarray(out["total_accepted_draft_tokens"]).reshape(-1)[0])
                steps.append((len(new), m.drafted, m.accepted))
            if r.perf:  # one call: its running values are the request's
                m.engine = EnginePerf()
                m.engine.add([out], output=True)
            if new:
                emit(new)

        # The perf outputs must be requested too: Triton returns only requested outputs.
        await self.call(
            self.cfg.tensorrt_llm_model_name,
            ins,
            [*bc.MANDATORY_OUTPUTS, *(bc.PERF_OUTPUTS if r.perf else bc.SPEC_PERF_OUTPUTS)],
            on_response,
        )
        m.steps = max(0, len(generated) - m.accepted)  # each engine step yields its accepted tokens + 1
        m.hist = engine_step_histogram(steps, self.cfg.max_draft_len, streamed)
        return generated, m
