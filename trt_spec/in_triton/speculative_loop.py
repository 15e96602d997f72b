"""The speculative loop of the `tensorrt_llm_bls` model, free of Triton.

The BLS (model_repo/tensorrt_llm_bls) is a thin adapter: it parses and tokenizes the text request, then runs
`generate` here with an `EngineCall` that turns dicts of numpy arrays into BLS requests to the engine models.
Tests run the same loop against a strict in-memory double of the `tensorrtllm` backend contract
(trt_spec/records/backend_contract.py). NVIDIA's own BLS is split the same way (lib/decode.py + lib/triton_decoder.py).

Modes:
- draft_target / ngram: loop { draft k tokens (the draft engine with request_output_len = k, or prompt
  lookup) -> verify with the target (draft_input_ids, request_output_len = len(draft) + 1) -> keep the
  target's tokens } until max_tokens, EOS or a stop word. Every round resends the whole sequence (the engine
  reuses its cached prefix), so the sequence must stay within the engine's input limit.
- engine (Medusa, EAGLE, lookahead: the target engine drafts by itself): ONE request for the whole
  generation, streamed through, with the engine's own acceptance metrics (return_perf_metrics); streamed from the
  engine whenever the deployment can (stream_engine), so the per-step accepted-length histogram comes from its
  responses (engine_step_histogram).

Every engine request asks for both mandatory outputs (output_ids, sequence_length) and sends sampling
inputs only when the client sent them (TensorRT-LLM treats absent top_k/top_p as greedy).
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
from ..records.speculation import BLS_MODES as MODES
from ..records.speculation import CACHE_SCOPES, LOOP_MODES, POLICIES, PROPOSERS, CacheScope, Policy
from ..reference.ngram import NgramDraft  # numpy only: safe in the GPU image too
from .suffix import SuffixCache, SuffixProposer  # pure Python

# The suffix proposer as served: a one-token match may propose, each matched token buys two proposed tokens (chosen by
# replaying the shipped code-edit, code and chat sets' greedy outputs; the adaptive policy caps the length by cost).
SUFFIX_MIN_MATCH, SUFFIX_TOKENS_PER_MATCH = 1, 2.0
# In the cross-request cache a match counts from two tokens (not tuned: a one-token match across requests is close to
# noise, and the hits of one common token would fill the store's candidate budget before the long matches that pay).
SUFFIX_CACHE_MIN_MATCH = 2

SEED_STRIDE = 1_000_003  # per-round seed offset: independent random streams across verify calls


class RequestError(TrtSpecError, ValueError):
    """A bad request: reported to the client as one error line; the server stays up."""


class EngineError(TrtSpecError, RuntimeError):
    """An engine model answered a call with an error."""


class Cancelled(TrtSpecError):
    """The client cancelled the request (or went away): the loop stopped between rounds."""


class EngineCall(Protocol):
    async def __call__(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        outputs: Sequence[str],
        on_response: Optional[Callable[[dict[str, np.ndarray]], None]] = None,
    ) -> list[dict[str, np.ndarray]]:
        """Send one request; return every response's outputs (calling on_response for each as it arrives).
        Raises EngineError on an error response."""


@dataclass(frozen=True)
class LoopConfig:
    target: str
    draft: Optional[str]
    mode: str  # draft_target | ngram | engine
    max_draft_len: int
    ngram_size: int
    max_seq_len: int
    max_input_len: int  # the engine's input limit (backend_contract.max_input_len)
    max_prompt_len: Optional[int] = None  # the deployment's limits.max_input_len (default: the engine's limit)
    draft_len_policy: str = Policy.ADAPTIVE.value  # speculation.LOOP_POLICIES (trt_spec/records/draft_policy.py)
    proposer: str = "suffix"  # ngram mode: suffix | prompt_lookup
    # the suffix proposer's cross-request cache (in_triton/suffix.py SuffixCache; speculative.suffix_cache)
    suffix_cache_scope: str = defaults.SUFFIX_CACHE_SCOPE
    suffix_cache_max_tokens: int = defaults.SUFFIX_CACHE_MAX_TOKENS
    suffix_cache_max_sequences: int = defaults.SUFFIX_CACHE_MAX_SEQUENCES
    suffix_cache_max_tenants: int = defaults.SUFFIX_CACHE_MAX_TENANTS

    @staticmethod
    def from_bls(p: BlsParameters) -> "LoopConfig":
        """The loop of a `tensorrt_llm_bls` model's parameters (records/bls_parameters.py; repository.writer writes
        them): the BLS in Triton and `bench in-process` alike."""
        return LoopConfig(
            target=p.tensorrt_llm_model_name,
            draft=p.tensorrt_llm_draft_model_name or None,
            mode=p.speculative_mode,
            max_draft_len=p.max_draft_len,
            ngram_size=p.ngram_size,
            max_seq_len=p.max_seq_len,
            max_prompt_len=p.max_input_len,
            max_input_len=bc.max_input_len(p.max_seq_len, p.max_num_tokens),
            draft_len_policy=p.draft_len_policy,
            proposer=p.proposer,
            suffix_cache_scope=p.suffix_cache_scope,
            suffix_cache_max_tokens=p.suffix_cache_max_tokens,
            suffix_cache_max_sequences=p.suffix_cache_max_sequences,
            suffix_cache_max_tenants=p.suffix_cache_max_tenants,
        )

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"speculative_mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.draft_len_policy not in POLICIES:
            raise ValueError(f"draft_len_policy {self.draft_len_policy!r}: use one of {', '.join(POLICIES)}")
        if self.proposer not in PROPOSERS:
            raise ValueError(f"proposer {self.proposer!r}: use one of {', '.join(PROPOSERS)}")
        if self.suffix_cache_scope not in CACHE_SCOPES:
            raise ValueError(f"suffix_cache_scope {self.suffix_cache_scope!r}: use one of {', '.join(CACHE_SCOPES)}")
        if self.mode == "draft_target" and not self.draft:
            raise ValueError("draft_target mode needs a draft model name")


@dataclass
class SpecRequest:
    prompt: list[int]
    max_tokens: int
    k: int
    end_id: int
    pad_id: int
    stream: bool = False
    sampling: dict[str, np.ndarray] = field(default_factory=dict)  # engine tensors, only those the client sent
    seed: Optional[int] = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    use_logits: bool = False
    draft_len_policy: Optional[str] = None  # adaptive | fixed for this request (default: the deployment's)
    perf: bool = False  # the client's return_perf_metrics: every engine call asks for the backend's perf outputs
    tenant: Optional[str] = None  # the client the request is from: the suffix cache's scope (None: no tenant)


@dataclass(frozen=True)
class Round:
    """One round of the loop (one target call): what the policy chose and what it cost."""

    k: int  # the draft length chosen; 0 = a round without speculation (a plain decode of `tokens` tokens)
    drafted: int  # tokens proposed (a proposer may offer fewer than k)
    accepted: int  # of those, accepted by the target
    tokens: int  # tokens the round added to the output
    draft_s: float  # seconds spent proposing (draft engine call, or the draft-free proposer)
    target_s: float  # seconds of the target call (verification, or the decode)
    cached: bool = False  # the proposal drew on the cross-request suffix cache (a stored occurrence backed it)


@dataclass
class EnginePerf:
    """The backend's per-request perf outputs (backend_contract.PERF_OUTPUTS, [1, 1] each) over every engine call one
    BLS request made (SpecRequest.perf): a loop mode makes one draft and one target call per round, each its own
    engine request. KV-cache blocks (new, reused, total) are SUMS over those calls; arrival and first-scheduled times
    are the first call's; the first-token time is the first target call's (the first tokens the client gets), the
    last-token time the last target call's. An in-engine mode makes one call: its own values. (The acceptance outputs
    are the loop's: LoopStats.)"""

    total: bc.PerfOutputs = field(default_factory=bc.PerfOutputs)  # its acceptance fields stay 0: the loop's

    def add(self, responses: Sequence[dict[str, np.ndarray]], *, output: bool) -> None:
        """One engine call's perf outputs (its last response carrying them: each response holds the request's values
        so far); output: the call's tokens go to the client (a target call, not a draft call)."""
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
    """One request's counters, filled by the loop: what the response reports and SpecMetricsExporter publishes."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    # rounds by accepted count 0..k (loop modes); in-engine modes: verify steps by accepted count 0..max_draft_len
    # (engine_step_histogram), empty when the engine's responses do not show its steps
    hist: list[int] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)  # loop modes: one per target call
    engine: EnginePerf = field(default_factory=EnginePerf)  # SpecRequest.perf: the engines' perf outputs
    cache_tokens: Optional[int] = None  # tokens the deployment's suffix cache holds once this request is in (None: off)

    def perf_outputs(self) -> dict[str, np.ndarray]:
        """The ten perf outputs of NVIDIA's tensorrt_llm_bls (backend_contract.PERF_OUTPUT_TYPES, [1, 1] each), for the
        request so far: the engines' (EnginePerf) and the loop's acceptance."""
        return replace(self.engine.total, accepted=self.accepted, drafted=self.drafted).tensors()

    @property
    def draft_lengths(self) -> list[int]:
        return [r.k for r in self.rounds]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def check_prompt_len(prompt_len: int, max_input_len: int) -> None:
    """The deployment's prompt limit, the same words from the ensemble's preprocessing and the BLS."""
    if prompt_len > max_input_len:
        raise RequestError(
            f"prompt is {prompt_len} tokens, more than max_input_len {max_input_len}; shorten it "
            "(or rebuild with a larger limits.max_input_len)"
        )


def validate(
    cfg: LoopConfig, prompt_len: int, max_tokens: int, k: int, use_logits: bool, policy: Optional[str] = None
) -> None:
    """Request checks before any engine call (one line each: the problem and the fix)."""
    if prompt_len == 0:
        raise RequestError(f"{TEXT_INPUT} is empty; send a non-empty prompt")
    if max_tokens <= 0:
        raise RequestError(f"{MAX_TOKENS} must be >= 1, got {max_tokens}")
    if cfg.max_prompt_len is not None:
        check_prompt_len(prompt_len, cfg.max_prompt_len)
    # The executor lowers request_output_len when prompt + it + the engine's max_draft_len exceeds max_seq_len
    # (backend_contract.OUTPUT_LEN_CLAMPED): refused here instead of answered short.
    if prompt_len + max_tokens + cfg.max_draft_len > cfg.max_seq_len:
        raise RequestError(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) + max_draft_len "
            f"({cfg.max_draft_len}) exceeds max_seq_len {cfg.max_seq_len}; lower max_tokens to at most "
            f"{max(0, cfg.max_seq_len - prompt_len - cfg.max_draft_len)}"
        )
    # Loop modes resend prompt + everything generated so far; the last round's input is prompt + max_tokens - 1.
    longest = prompt_len + max_tokens - 1 if cfg.mode in LOOP_MODES else prompt_len
    if longest > cfg.max_input_len:
        what = "prompt + max_tokens - 1" if cfg.mode in LOOP_MODES else "prompt"
        raise RequestError(
            f"{what} ({longest} tokens) exceeds the engine's input limit {cfg.max_input_len} "
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
    if use_logits and cfg.mode != "draft_target":
        raise RequestError("use_draft_logits needs draft-target mode (this deployment has no draft model)")


def check_tenant(tenant: Optional[str]) -> Optional[str]:
    """A request's tenant id: None for none or an empty one; refused when longer than TENANT_MAX_BYTES."""
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
    """Sampling and token-id values, checked before any engine call (the engine's own checks name engine tensors
    a client never sent; these name the client's inputs)."""
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
    """One engine request in the backend's tensor format ([1, …]: batch dimension first)."""
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
    if r.perf:  # the backend writes its perf outputs only when asked (EnginePerf sums them)
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
    """Whether the target stopped at the end token in this round. The engine does not output end_id
    (backend_contract.EOS_EXCLUDED), so the round says it by returning less than a round always returns otherwise:
    a decode of out_len tokens returns out_len; a verification returns its accepted drafts plus one token of the
    target's own, which differs from the next draft (or is the bonus after all of them). Only a round that stopped
    at end_id returns nothing but a prefix of the draft."""
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


# -- in-engine modes: the engine's verify steps from its streamed responses ---------------------------------------
# TensorRT-LLM's engine runtime (the C++ executor behind the tensorrtllm backend; read at the stored 1.2-line commits of
# NVIDIA/TensorRT-LLM, the v1.2.1 tag being too large to fetch here):
# - cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp (d879430b) calls, for every request after every
#   iteration, llmReq->updateNumTokensPerIteration(tokens the iteration added, ...) BEFORE it fills the draft tokens
#   for the next step; cpp/include/tensorrt_llm/batch_manager/llmRequest.h (d879430b) updateNumTokensPerIteration then
#   adds, only when the request had draft tokens in that iteration (hasDraftTokens) and asked for perf metrics,
#   tokens - 1 to totalAcceptedDraftTokens and min(draft tokens, the module's max draft PATH length) to
#   totalDraftTokens. So the context phase (no drafts yet) adds nothing; each verify step adds exactly its own counts;
#   a tree (Medusa, EAGLE) counts its path length, not its nodes.
# - cpp/tensorrt_llm/batch_manager/llmRequest.cpp (89fd9b74) createResult: a streaming request gets a result whenever
#   it has tokens past the last one sent (one per iteration), a finished one its final result; each carries
#   requestPerfMetrics, the running totals; the backend writes them on every response (backend_contract
#   PERF_OUTPUT_TYPES).
# So, streamed, each response's change in the two totals is one iteration's verify step: a step with drafts adds
# (drafted > 0, accepted = its tokens - 1), the context and plain decode steps add (0, 0). The reference engine's
# EAGLE/Medusa path answers the same (reference/batching.py _complete_eagle: one on_tokens response per step; a chain
# the policy cut short or a run without drafts shows as a smaller or zero drafted change).
# Not honest, so no histogram: a non-streamed call (one response, all steps summed), and any response that holds more
# than one step with drafts (tokens > accepted + 1: an engine that batches iterations into one response, as the
# PyTorch flow's stream_interval > 1 does). Only the last response may hold fewer tokens than accepted + 1: the
# request's end cut its step (the end token, which the engine does not output, a stop word, max_tokens) after the
# engine counted it.


def engine_step_histogram(responses: Sequence[tuple[int, int, int]], k: int, streamed: bool) -> list[int]:
    """An in-engine request's verify steps by accepted draft count 0..k (k: the engine's max_draft_len, vLLM's
    num_spec_tokens), from its engine responses in order, each (tokens, total_draft_tokens, total_accepted_draft_tokens)
    as the response carried them; steps without drafts are not counted (as vLLM counts). [] when the responses do not
    show the steps one by one (see above). It adds up with the engine's totals by construction: sum(j * h[j]) is the
    last response's accepted total, and every drafted token is in a counted step."""
    if not streamed:
        return []
    hist = [0] * (k + 1)
    drafted = accepted = 0
    for i, (tokens, d_total, a_total) in enumerate(responses):
        d, a = d_total - drafted, a_total - accepted
        drafted, accepted = d_total, a_total
        if d == 0 and a == 0:  # the context step, a step without drafts (or a response with no step)
            continue
        last = i == len(responses) - 1
        if not 0 <= a <= min(d, k) or tokens > a + 1 or (tokens < a + 1 and not last):
            return []
        hist[a] += 1
    if sum(j * h for j, h in enumerate(hist)) != accepted:  # the definition AIPerf checks (cannot fail; said here)
        return []
    return hist


class SpeculativeLoop:
    def __init__(self, cfg: LoopConfig, call: EngineCall, *, stream_engine: bool = False):
        """stream_engine: in-engine modes stream their engine call whether or not the client streams (the engine
        models are decoupled: the BLS's deployment is), so every request gets its per-step histogram. The cost is
        the engine's per-iteration responses (one BLS response per step instead of one per request), a few python
        backend messages per step, small next to a GPU step."""
        self.cfg = cfg
        self.call = call
        self.stream_engine = stream_engine
        self.ngram = NgramDraft(max_ngram=cfg.ngram_size, k=cfg.max_draft_len)
        self.policy = DraftLengthPolicy(cfg.draft_len_policy)  # shared costs; `active` = requests in the loop
        # earlier requests' text for the suffix proposer (None: no cache, or a mode / proposer that cannot use one)
        self.cache = None
        if cfg.mode == "ngram" and cfg.proposer == "suffix" and cfg.suffix_cache_scope != CacheScope.OFF:
            self.cache = SuffixCache(
                cfg.suffix_cache_scope,
                max_tokens=cfg.suffix_cache_max_tokens,
                max_sequences=cfg.suffix_cache_max_sequences,
                max_tenants=cfg.suffix_cache_max_tenants,
                anchor_len=SUFFIX_CACHE_MIN_MATCH,
            )

    async def generate(
        self,
        r: SpecRequest,
        emit: Callable[[list[int]], None],
        cancelled: Callable[[], bool] = lambda: False,
        metrics: Optional[LoopStats] = None,
    ) -> tuple[list[int], LoopStats]:
        """Generated tokens and metrics; `emit(new_tokens)` is called once per accepted chunk (streaming).
        `cancelled()` is checked before every round: once true the loop raises Cancelled and sends no more
        engine calls. In-engine modes make one call: `cancelled()` is checked at each streamed response, and the
        Cancelled raised there makes `call` cancel the engine request where the python backend can (a BLS response
        iterator's cancel(), python_backend r25.05+; Triton 2.51's BLS cannot, so there the call runs out).
        metrics: the object to fill (the caller reads it at each emit: a streamed chunk's perf outputs so far)."""
        m = metrics if metrics is not None else LoopStats()
        if self.cfg.mode == "engine":
            return await self._in_engine(r, emit, cancelled, m)
        self.policy.active += 1
        try:
            generated, m = await self._loop(r, emit, cancelled, m)
        finally:
            self.policy.active -= 1
        if self.cache is not None:  # a finished request (not cancelled, no error): later ones of its scope may copy it
            self.cache.add(r.tenant, [*r.prompt, *generated])
            m.cache_tokens = self.cache.num_tokens
        return generated, m

    async def _draft(
        self, r: SpecRequest, tokens: list[int], k: int, step: int, proposer, m: LoopStats
    ) -> tuple[list[int], Optional[np.ndarray]]:
        if k <= 0:
            return [], None
        if proposer is not None:
            return proposer.propose(tokens, k, (r.end_id,)), None
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
        return draft, logits

    def _proposer(self, r: SpecRequest):
        """The request's draft-free proposer (ngram mode); None in draft-target mode."""
        if self.cfg.mode != "ngram":
            return None
        if self.cfg.proposer == "prompt_lookup":
            return self.ngram
        # per request: it indexes the request's own sequence, and searches the store of the request's cache scope
        return SuffixProposer(
            k_max=self.cfg.max_draft_len,
            min_match=SUFFIX_MIN_MATCH,
            tokens_per_match=SUFFIX_TOKENS_PER_MATCH,
            store=self.cache.store(r.tenant) if self.cache is not None else None,
        )

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
            # The policy decides in the open: a Decision record now, learning only from the round's Outcome.
            decision = policy.decide(cap, self.policy.active, remaining, draft_free=draft_free, first=not generated)
            t0 = time.perf_counter()
            draft, logits = await self._draft(r, tokens, decision.k if decision.speculate else 0, m.steps, proposer, m)
            t1 = time.perf_counter()
            empty = draft_free and not draft
            if draft_free:  # the proposer was free to consult: now decide on what it proposed
                decision = policy.confirm(decision, len(draft), t1 - t0)
                if not decision.speculate:
                    draft = []
            # a run without speculation: one target call, one chunk to a streaming client
            out_len = len(draft) + 1 if draft else decision.run_len
            ins = engine_inputs(r, tokens, out_len, SEED_STRIDE * m.steps)
            if draft:
                ins[bc.DRAFT_INPUT_IDS] = np.asarray([draft], dtype=np.int32)
                if logits is not None:
                    ins[bc.DRAFT_LOGITS] = logits[None]
            responses = await self.call(
                self.cfg.target, ins, list(bc.MANDATORY_OUTPUTS) + (list(bc.PERF_OUTPUTS) if r.perf else [])
            )
            t2 = time.perf_counter()
            m.engine.add(responses, output=True)
            new = [t for out in responses for t in response_tokens(out)][:remaining]
            acc = 0
            while acc < min(len(draft), len(new)) and new[acc] == draft[acc]:
                acc += 1
            k_used = decision.k if draft else 0
            policy.observe(
                decision, Outcome(len(draft), acc, len(new), t1 - t0, t2 - t1, empty=empty), draft_free=draft_free
            )
            cached = bool(draft) and getattr(proposer, "store_hit", False)  # the suffix proposer drew on the cache
            m.rounds.append(Round(k_used, len(draft), acc, len(new), t1 - t0, t2 - t1, cached))  # Round's field order
            m.steps += 1
            m.drafted += len(draft)
            m.accepted += acc
            if draft:
                m.hist[min(acc, r.k)] += 1
            # stop conditions: the engine's end token (not output), stop words (kept), budget
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
        steps: list[tuple[int, int, int]] = []  # per response: tokens, drafted and accepted totals

        def on_response(out: dict[str, np.ndarray]) -> None:
            if cancelled():
                raise Cancelled(f"request cancelled after {len(generated)} tokens")
            new = response_tokens(out)
            generated.extend(new)
            if "total_draft_tokens" in out:
                m.drafted = int(np.asarray(out["total_draft_tokens"]).reshape(-1)[0])
                m.accepted = int(np.asarray(out["total_accepted_draft_tokens"]).reshape(-1)[0])
                steps.append((len(new), m.drafted, m.accepted))
            if r.perf:  # one call: its values so far are the request's
                m.engine = EnginePerf()
                m.engine.add([out], output=True)
            if new:
                emit(new)

        # The perf outputs must be requested too: Triton returns only requested outputs.
        await self.call(
            self.cfg.target,
            ins,
            [*bc.MANDATORY_OUTPUTS, *(bc.PERF_OUTPUTS if r.perf else bc.SPEC_PERF_OUTPUTS)],
            on_response,
        )
        m.steps = max(0, len(generated) - m.accepted)  # each engine step yields its accepted tokens + 1
        m.hist = engine_step_histogram(steps, self.cfg.max_draft_len, streamed)
        return generated, m
