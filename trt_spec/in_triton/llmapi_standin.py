"""The CPU stand-in of the LLM-API Triton model (records/llmapi_contract.py), free of Triton.

Same model.yaml, tensors and refusals; speculates inside with the speculative loop at fixed k = max_draft_len over
the reference engines' stand-ins. Without speculative_config it is the baseline: one decode of the target.
Request defaults as NVIDIA's model (upstream-facts: standin-llmapi-request-defaults).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..errors import TrtSpecError
from ..records import backend_contract as bc
from ..records import llmapi_contract as lc
from ..records.bls_parameters import BlsParameters
from ..records.speculation import Mode, Policy, Proposer
from .local_engines import LocalEngines
from .serving import (
    IncrementalDetokenizer,
    check_input_bytes,
    decode_strings,
    encode,
    input_byte_limit,
    load_tokenizer,
    scalar,
)
from .speculative_loop import (
    EngineError,
    RequestError,
    SpecRequest,
    SpeculativeLoop,
    check_sampling,
    engine_inputs,
    response_tokens,
    validate,
)

DEFAULT_MAX_TOKENS = 32  # tensorrt_llm SamplingParams.max_tokens default
TARGET, DRAFT = "target", "draft"
MODES = {"NGram": "ngram", "DraftTarget": "draft_target"}  # the decoding types the CPU stand-in serves


class LlmapiError(TrtSpecError, ValueError):
    """A refusal in the LLM-API model's own words."""


@dataclass
class LlmRequest:
    text: str
    prompt: list[int]
    max_tokens: int
    streaming: bool = False
    exclude_input: bool = False
    return_perf: bool = False
    return_finish_reason: bool = False
    sampling: dict[str, np.ndarray] = field(default_factory=dict)  # engine tensors
    seed: Optional[int] = None


def _engine(name: str, engine_dir: str, decoupled: bool):
    """A reference engine; GPU_NUMERICS_ENV in the server's environment perturbs its verification forwards as a GPU
    flips near-ties on the speculative path (reference/numerics.py), which check then reports unverified."""
    from ..reference.numerics import GpuNumerics
    from ..reference.standin import StandIn

    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "enable_kv_cache_reuse": "true",
        "enable_chunked_context": "false",
        "tokenizer_dir": engine_dir,
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    }
    return StandIn.from_engine_dir(name, params, decoupled=decoupled, numerics=GpuNumerics.from_env())


class LlmapiStandIn:
    def __init__(self, y: dict, *, decoupled: bool, name: str = lc.MODEL_NAME):
        self.name, self.decoupled = name, decoupled
        spec = y.get("speculative_config")
        self.mode = None
        if spec is not None:
            self.mode = MODES.get(spec.get("decoding_type"))
            if self.mode is None:
                raise LlmapiError(
                    f"speculative_config decoding_type {spec.get('decoding_type')!r} is not served by the "
                    f"CPU stand-in ({', '.join(MODES)}); EAGLE-3 and MTP need TensorRT-LLM on a GPU"
                )
        standins = {TARGET: _engine(TARGET, y["model"], True)}
        if self.mode == Mode.DRAFT_TARGET:
            standins[DRAFT] = _engine(DRAFT, spec[lc.SPEC_MODEL_DIR], True)
        self.engines = LocalEngines(standins)
        lim = standins[TARGET].limits
        k = int(spec.get("max_draft_len", 0)) if spec else 0
        self.k = k
        self.loop = SpeculativeLoop(
            BlsParameters(
                tensorrt_llm_model_name=TARGET,
                tensorrt_llm_draft_model_name=DRAFT if self.mode == Mode.DRAFT_TARGET else "",
                speculative_mode=self.mode or Mode.NGRAM.value,
                max_draft_len=max(k, 1),
                num_draft_tokens=max(k, 1),
                ngram_size=int((spec or {}).get(lc.NGRAM_MATCH, 3)),
                draft_len_policy=Policy.FIXED,
                proposer=Proposer.PROMPT_LOOKUP,
                max_seq_len=lim.max_seq_len,
                max_num_tokens=lim.max_num_tokens,
                tokenizer_dir=y["model"],
            ),
            self.engines,
        )
        self.tokenizer = load_tokenizer(y["model"])
        self.byte_limit = input_byte_limit(self.tokenizer, self.loop.cfg.engine_input_limit)

    def close(self) -> None:
        self.engines.close()

    def parse(self, inputs: dict[str, Optional[np.ndarray]]) -> LlmRequest:
        """The request tensors (no batch dimension), checked as the LLM-API model checks them."""
        if inputs.get(lc.TEXT_INPUT) is None:
            raise LlmapiError(lc.NO_TEXT_INPUT)
        streaming = bool(scalar(inputs.get(lc.STREAMING), False))
        if streaming and not self.decoupled:
            raise LlmapiError(lc.STREAMING_NEEDS_DECOUPLED)
        try:  # stricter than the LLM-API model: refused before tokenizing
            limit = self.loop.cfg.engine_input_limit
            check_input_bytes(inputs.get(lc.TEXT_INPUT), self.byte_limit, lc.TEXT_INPUT, limit)
        except RequestError as e:
            raise LlmapiError(lc.GENERATION_ERROR.format(msg=e)) from None
        if inputs.get(lc.STOP_INPUT) is not None:  # the LLM-API model fails it too
            raise LlmapiError(lc.GENERATION_ERROR.format(msg=lc.STOP_REFUSED))
        text = (decode_strings(inputs[lc.TEXT_INPUT]) or [""])[0]

        def param(name, kind):
            return scalar(inputs.get(lc.SAMPLING_PREFIX + name), None, kind)

        temperature, top_k, top_p, seed = (
            param("temperature", float),
            param("top_k", int),
            param("top_p", float),
            param("seed", int),
        )
        max_tokens = param("max_tokens", int)
        r = LlmRequest(
            text,
            encode(self.tokenizer, text) if text else [],
            DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            streaming,
            bool(param("exclude_input_from_output", bool) or False),
            bool(param("return_perf_metrics", bool) or False),
            bool(scalar(inputs.get("return_finish_reason"), False)),
            seed=seed,
        )
        try:
            check_sampling(
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                end_id=self.end_id,
                pad_id=0,
                vocab_size=len(self.tokenizer),
            )
            validate(self.loop.cfg, len(r.prompt), r.max_tokens, self.k, False)
        except RequestError as e:
            raise LlmapiError(lc.GENERATION_ERROR.format(msg=e)) from None
        for value, engine_name, dtype in (
            (temperature, bc.TEMPERATURE, np.float32),
            (top_k, bc.RUNTIME_TOP_K, np.int32),
            (top_p, bc.RUNTIME_TOP_P, np.float32),
        ):
            if value is not None:
                r.sampling[engine_name] = np.asarray([[value]], dtype=dtype)
        return r

    @property
    def end_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    async def generate(
        self, r: LlmRequest, emit: Callable[[dict], None], cancelled: Callable[[], bool] = lambda: False
    ) -> dict:
        """Streamed responses go to emit; returns the final response's tensors."""
        detok = IncrementalDetokenizer(self.tokenizer)
        arrival = time.monotonic_ns()
        times: list[int] = []
        chunks: list[str] = []
        head = "" if r.exclude_input else r.text
        pending: list[dict] = []  # held until the next one comes: the last is sent as final

        def on_tokens(new: list[int]) -> None:
            times.append(time.monotonic_ns())
            delta = detok.add(new)
            chunks.append(delta)
            if r.streaming:  # per iteration, the whole text so far (upstream-facts: standin-llmapi-cumulative-text)
                if pending:
                    emit(pending.pop())
                pending.append({lc.TEXT_OUTPUT: np.array([(head + "".join(chunks)).encode("utf-8")], dtype=object)})

        try:
            if self.mode is None:
                tokens, drafted, accepted = await self._decode(r, on_tokens), 0, 0
            else:
                spec = SpecRequest(
                    r.prompt,
                    r.max_tokens,
                    self.k,
                    self.end_id,
                    0,
                    sampling=r.sampling,
                    seed=r.seed,
                )
                tokens, m = await self.loop.generate(spec, on_tokens, cancelled)
                drafted, accepted = m.drafted, m.accepted
        except (EngineError, RequestError) as e:
            raise LlmapiError(lc.GENERATION_ERROR.format(msg=e)) from None
        tail = detok.flush()
        chunks.append(tail)
        out = {lc.TEXT_OUTPUT: np.array([(head + "".join(chunks)).encode("utf-8")], dtype=object)}
        if r.return_finish_reason:
            reason = "length" if len(tokens) >= r.max_tokens else "stop"
            out["finish_reason"] = np.array([reason.encode()], dtype=object)
        if r.return_perf:  # every value as a string (upstream-facts: standin-llmapi-perf-strings)
            perf = {
                "arrival_time_ns": arrival,
                "first_scheduled_time_ns": arrival,
                "first_token_time_ns": times[0] if times else 0,
                "last_token_time_ns": times[-1] if times else 0,
                # upstream-facts: standin-llmapi-spec-perf-zero
                "acceptance_rate": 0.0 if lc.SPEC_PERF_ZERO else (accepted / drafted if drafted else 0.0),
                "total_accepted_draft_tokens": 0 if lc.SPEC_PERF_ZERO else accepted,
                "total_draft_tokens": 0 if lc.SPEC_PERF_ZERO else drafted,
                "kv_cache_reused_block": 0,
                "kv_cache_hit_rate": 0.0,
                "kv_cache_alloc_new_blocks": 0,
                "kv_cache_alloc_total_blocks": 0,
                "kv_cache_missed_block": 0,
            }
            out.update({k: np.array([str(v).encode()], dtype=object) for k, v in perf.items()})
        return out

    async def _decode(self, r: LlmRequest, on_tokens) -> list[int]:
        """The baseline: one streamed decode of the target."""
        spec = SpecRequest(r.prompt, r.max_tokens, 0, self.end_id, 0, sampling=r.sampling, seed=r.seed)
        ins = engine_inputs(spec, r.prompt, r.max_tokens, 0, streaming=True)
        tokens: list[int] = []

        def on_response(out):
            new = response_tokens(out)
            if new:
                tokens.extend(new)
                on_tokens(new)

        await self.engines(TARGET, ins, list(bc.MANDATORY_OUTPUTS), on_response)
        return tokens
