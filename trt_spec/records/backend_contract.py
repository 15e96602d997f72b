"""The contract of NVIDIA's `tensorrtllm` Triton backend and executor, for the parameters and tensors trt-spec uses.

Read by the repository writer, the CPU stand-in `model_repo/reference_engine` and the tests, so the two cannot drift
apart; the stand-in is at least as strict as the backend. MS/MIS/U name backend sources
(upstream-facts: contract-backend-sources).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from ..errors import TrtSpecError

BACKEND = "tensorrtllm_backend@c2e65b8 inflight_batcher_llm/src"

# -- Parameters (config.pbtxt `parameters { key: … value { string_value: … } }`)

# A missing key fails the model load (upstream-facts: contract-required-parameters).
REQUIRED_PARAMETERS: dict[str, str] = {
    "gpt_model_type": "MIS getBatchingTypeFromParams (L62)",
    "tokenizer_dir": "MIS getGuidedDecodingConfigFromParams (L413)",
    "xgrammar_tokenizer_info_path": "MIS getGuidedDecodingConfigFromParams (L414)",
    "guided_decoding_backend": "MIS getGuidedDecodingConfigFromParams (L415)",
}
LOAD_ERROR = "unexpected error when creating modelInstanceState: {msg}"
MISSING_PARAMETER = "Cannot find parameter with name: {name}"
GPT_MODEL_TYPES = ("V1", "v1", "inflight_batching", "inflight_fused_batching")
INVALID_MODEL_TYPE = "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
# Only "" turns guided decoding off, not "none"/"off" (upstream-facts: contract-guided-decoding-off).
GUIDED_DECODING_OFF = ""
# Mandatory when decoding_mode == lookahead (upstream-facts: contract-lookahead-parameters).
LOOKAHEAD_PARAMETERS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
LOOKAHEAD_MISSING = (
    "Decoding mode is set to lookahead but lookahead parameters are not specified. Please set "
    "parameters lookahead_window_size, lookahead_ngram_size, and lookahead_verification_set_size."
)
DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")
# Missing, empty or unparsable -> this default; [1] says where the backend reads it
# (upstream-facts: contract-parameter-defaults).
PARAMETER_DEFAULTS: dict[str, tuple[Optional[str], str]] = {
    "max_beam_width": ("1", "MIS getExecutorConfigFromParams L459-468"),
    "enable_kv_cache_reuse": ("true", "MIS getKvCacheConfigFromParams L167-176"),
    "exclude_input_in_output": ("false", "MIS constructor L797-807 (a request input overrides it, U L915-927)"),
    "enable_chunked_context": ("false", "MIS getExecutorConfigFromParams L518-533"),
    "batch_scheduler_policy": ("guaranteed_no_evict", "MIS getSchedulerConfigFromParams L356-381"),
    "cancellation_check_period_ms": ("100", "MIS constructor L809-819"),
    "stats_check_period_ms": ("100", "MIS constructor L821-831"),
    "kv_cache_free_gpu_mem_fraction": (None, "MIS getKvCacheConfigFromParams L96-107 (executor default 0.9)"),
    "max_tokens_in_paged_kv_cache": (None, "MIS getKvCacheConfigFromParams L83-94 (min with the fraction)"),
    "decoding_mode": (None, "MIS L545-592 (unset: top_k_top_p with beam width 1)"),
    "gpu_device_ids": (None, "MS LoadParameters L95-120 ('0,1;2,3': per-instance device groups)"),
    "gpt_model_path": (
        "",
        "MIS constructor L743-755 (missing/nonexistent -> '', then 'Both encoder and decoder model paths are empty')",
    ),
    "executor_worker_path": (
        "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
        "MS GetExecutorWorkerPath L180-188 (orchestrator mode only)",
    ),
}
MODEL_PATHS_EMPTY = "Both encoder and decoder model paths are empty"

# One gauge per request_type, from the executor's iteration stats; queued requests are in none, so "engine idle" =
# active 0 (upstream-facts: contract-request-metrics).
REQUEST_METRICS = "nv_trt_llm_request_metrics"
REQUEST_METRICS_HELP = "TRT LLM request metrics"
REQUEST_TYPES = ("active", "max", "scheduled", "context", "waiting")

# Max batch size and tokens come from the engine's build config (upstream-facts: contract-executor-batch-limits). The
# queue bound is the model config's dynamic_batching max_queue_size, 0 or unset = unbounded; a full queue fails the
# request with one error response (upstream-facts: contract-queue-full). The stand-in sends the message only.
QUEUE_FULL = "Maximum queue size of {max} has been reached, please try again later"


class ContractError(TrtSpecError, ValueError):
    """What the backend would refuse, with its own message."""


def check_parameters(params: Mapping[str, str]) -> None:
    """Load-time checks of a `tensorrt_llm` model's parameters, in the backend's order; raises ContractError."""
    if "gpt_model_type" not in params:
        raise ContractError(LOAD_ERROR.format(msg=MISSING_PARAMETER.format(name="gpt_model_type")))
    if params["gpt_model_type"] not in GPT_MODEL_TYPES:
        raise ContractError(LOAD_ERROR.format(msg=INVALID_MODEL_TYPE))
    if params.get("decoding_mode") == "lookahead" and not all(_is_int(params.get(k)) for k in LOOKAHEAD_PARAMETERS):
        raise ContractError(LOAD_ERROR.format(msg=LOOKAHEAD_MISSING))
    for name in ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"):
        if name not in params:
            raise ContractError(LOAD_ERROR.format(msg=MISSING_PARAMETER.format(name=name)))
    if not params.get("gpt_model_path"):
        raise ContractError(LOAD_ERROR.format(msg=MODEL_PATHS_EMPTY))


def max_queue_size(model_config: Mapping) -> Optional[int]:
    """The executor's queue bound from a model config (JSON form); None when unset or 0 (unbounded)."""
    policy = model_config.get("dynamic_batching", {}).get("default_queue_policy", {})
    try:
        n = int(policy.get("max_queue_size", 0))  # int64 fields arrive as JSON strings
    except (TypeError, ValueError):
        return None  # the backend logs a warning and leaves it unset
    return n if n > 0 else None


def _is_int(v: Optional[str]) -> bool:
    try:
        return v is not None and int(v) >= 0
    except ValueError:
        return False


def parameter(params: Mapping[str, str], name: str) -> Optional[str]:
    """A parameter's value, or the backend's default when absent or empty."""
    v = params.get(name)
    return v if v not in (None, "") else PARAMETER_DEFAULTS.get(name, (None, ""))[0]


def parse_bool(v: Optional[str], name: str) -> bool:
    """The backend's bool parameter: True/true/TRUE/1, False/false/FALSE/0; else ContractError.

    (upstream-facts: contract-parse-bool)"""
    if v in ("True", "true", "TRUE", "1"):
        return True
    if v in ("False", "false", "FALSE", "0"):
        return False
    raise ContractError(f"Cannot convert {v} to a boolean. (parameter {name})")


# -- Tensors (dims without the batch dimension)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton TYPE_* name
    dims: tuple[int, ...]
    optional: bool = True
    scalar: bool = False  # dims [1] with reshape: { shape: [] }
    ragged: bool = False


# Logits are FP32 end to end; why not FP16: see HALF_MAX (upstream-facts: contract-dtm-logits-fp32).
LOGITS_DTYPE = "float32"
LOGITS_TYPE = "TYPE_FP32"
FP16_LOGITS = "float16"  # ModelOpt's export default for bf16 checkpoints (upstream-facts: modelopt-fp16-logits)
LOGITS_DTYPES = (LOGITS_DTYPE, FP16_LOGITS)
# The engine's tensor names, as NVIDIA's config template spells them (upstream-facts: contract-tensor-names).
INPUT_IDS = "input_ids"
INPUT_LENGTHS = "input_lengths"
REQUEST_OUTPUT_LEN = "request_output_len"
DRAFT_INPUT_IDS = "draft_input_ids"
DRAFT_LOGITS = "draft_logits"
END_ID = "end_id"
PAD_ID = "pad_id"
STOP_WORDS_LIST = "stop_words_list"
BAD_WORDS_LIST = "bad_words_list"
TEMPERATURE = "temperature"
RUNTIME_TOP_K = "runtime_top_k"
RUNTIME_TOP_P = "runtime_top_p"
SEED = "seed"
STREAMING = "streaming"
EXCLUDE_INPUT_IN_OUTPUT = "exclude_input_in_output"
RETURN_GENERATION_LOGITS = "return_generation_logits"
RETURN_PERF_METRICS = "return_perf_metrics"
OUTPUT_IDS = "output_ids"
SEQUENCE_LENGTH = "sequence_length"
GENERATION_LOGITS = "generation_logits"

# The subset of the template's inputs that trt-spec declares.
INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec(INPUT_IDS, "TYPE_INT32", (-1,), ragged=True),
    TensorSpec(INPUT_LENGTHS, "TYPE_INT32", (1,), optional=False, scalar=True),
    TensorSpec(REQUEST_OUTPUT_LEN, "TYPE_INT32", (1,), optional=False, scalar=True),
    TensorSpec("num_return_sequences", "TYPE_INT32", (1,), scalar=True),
    TensorSpec(DRAFT_INPUT_IDS, "TYPE_INT32", (-1,), ragged=True),
    # Encoder-decoder only, but NVIDIA's clients send it (upstream-facts: contract-decoder-input-ids).
    TensorSpec("decoder_input_ids", "TYPE_INT32", (-1,), ragged=True),
    TensorSpec(DRAFT_LOGITS, LOGITS_TYPE, (-1, -1), ragged=True),
    TensorSpec("draft_acceptance_threshold", "TYPE_FP32", (1,), scalar=True),
    TensorSpec(END_ID, "TYPE_INT32", (1,), scalar=True),
    TensorSpec(PAD_ID, "TYPE_INT32", (1,), scalar=True),
    TensorSpec(STOP_WORDS_LIST, "TYPE_INT32", (2, -1), ragged=True),
    TensorSpec(BAD_WORDS_LIST, "TYPE_INT32", (2, -1), ragged=True),
    TensorSpec("beam_width", "TYPE_INT32", (1,), scalar=True),
    TensorSpec(TEMPERATURE, "TYPE_FP32", (1,), scalar=True),
    TensorSpec(RUNTIME_TOP_K, "TYPE_INT32", (1,), scalar=True),
    TensorSpec(RUNTIME_TOP_P, "TYPE_FP32", (1,), scalar=True),
    TensorSpec(SEED, "TYPE_UINT64", (1,), scalar=True),
    TensorSpec(STREAMING, "TYPE_BOOL", (1,), scalar=True),
    TensorSpec(EXCLUDE_INPUT_IN_OUTPUT, "TYPE_BOOL", (1,), scalar=True),
    TensorSpec(RETURN_GENERATION_LOGITS, "TYPE_BOOL", (1,), scalar=True),
    TensorSpec(RETURN_PERF_METRICS, "TYPE_BOOL", (1,), scalar=True),
)
# With return_perf_metrics, on EVERY response, requested or not (upstream-facts: contract-perf-outputs).
PERF_OUTPUT_TYPES: dict[str, str] = {
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",  # steady_clock ns, not Unix time
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
}
PERF_OUTPUTS = tuple(PERF_OUTPUT_TYPES)
SPEC_PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")  # what speculation reads
OUTPUTS: tuple[TensorSpec, ...] = (
    # upstream-facts: contract-output-shapes
    TensorSpec(OUTPUT_IDS, "TYPE_INT32", (-1, -1)),  # sent as [1, beams, T], -1 padded
    TensorSpec(SEQUENCE_LENGTH, "TYPE_INT32", (-1,)),  # sent as [1, beams]: tokens in THIS response
    TensorSpec(GENERATION_LOGITS, LOGITS_TYPE, (-1, -1, -1)),  # [1, beams, T, V]; needs return_generation_logits
    *(TensorSpec(name, dtype, (1,)) for name, dtype in PERF_OUTPUT_TYPES.items()),
)
# A request that does not ask for both gets one final error response (upstream-facts: contract-mandatory-outputs).
MANDATORY_OUTPUTS = (OUTPUT_IDS, SEQUENCE_LENGTH)
MISSING_OUTPUT = "Error encountered while populating response: {name} tensor must be present in list of output tensors"
# The C++ backend fails a response with an undeclared output; a python model's are pruned silently, so the stand-in
# checks its own config (upstream-facts: triton-undeclared-output).
UNDECLARED_OUTPUT = (
    "Error encountered while populating response: Could not get response output for output tensor "
    "{name}: unexpected inference output '{name}' for model '{model}'"
)

# Logits cross the backend only in the config's logits type: an engine whose logits dtype differs fails every
# draft-logits or generation-logits request (upstream-facts: contract-logits-dtype-match).
LOGITS_DTYPE_MISMATCH = (
    "Incompatible data types: the engine's logits are {engine} but the model config declares "
    "{config} logits; rebuild the engine with --logits_dtype {config} (trt-spec's plan does)"
)
TYPE_TO_LOGITS_DTYPE = {"TYPE_FP32": LOGITS_DTYPE, "TYPE_FP16": FP16_LOGITS}

# A sampled end_id ends the request and is neither in output_ids nor counted; stop words are kept
# (upstream-facts: trtllm-eos-excluded).
EOS_EXCLUDED = True

# Logits are scaled by 1 / (T + TEMPERATURE_EPS), then clamped to ±HALF_MAX when FP16: temperature 0 is not greedy
# there (ties), so clients send no temperature for greedy (upstream-facts: trtllm-temperature-clamp).
TEMPERATURE_EPS = 1e-6
HALF_MAX = 65504.0

# -- Request rules: the backend's and executor's error texts (upstream-facts: contract-request-errors)

STREAMING_NEEDS_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
BATCH_NEEDS_DECOUPLED = "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
NO_OUTPUT_LEN = "request_output_len is not present in the request"
NO_INPUT_IDS = "input_ids or encoder_input_features is not present in the request."
INVALID_SIZE = "Invalid size for tensor {name}"
EMPTY_INPUT = "input_ids is empty; send at least one token"  # trt-spec's own (stricter) check
EXECUTOR_ERROR = "Encountered an error when fetching new request: {msg}"
PROMPT_TOO_LONG = (
    "Prompt length ({n}) exceeds maximum input length ({max}). Set log level to info and check "
    "TRTGptModel logs for how maximum input length is set"
)
DRAFT_TOO_LONG = "Draft tokens length ({n}) exceeds maximum draft tokens length ({max})."
# Only an engine built with --gather_generation_logits answers return_generation_logits; a one-token request then
# returns the next-token logits after its prompt, the probe `trt-spec check` reads
# (upstream-facts: executor-gather-generation-logits).
NO_GENERATION_LOGITS = "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig"
# Steps of the logits cache the flag allocates at load, outside the KV cache
# (upstream-facts: executor-generation-logits-cache).
GENERATION_LOGITS_CACHE_STEPS = 8
BEAM_WIDTH = "Assertion failed: beamWidth ({n}) exceeds max_beam_width ({max})"
TEMPERATURE_NEGATIVE = "Assertion failed: temperature.value() >= 0.f"
# Not an error: the executor logs it and generates fewer tokens (upstream-facts: executor-output-len-clamp).
OUTPUT_LEN_CLAMPED = (
    "Prompt length + number of requested output tokens + draft tokens per step ({p} + {n} + {d}) "
    "exceeds maximum sequence length ({max}). Number of requested output tokens is changed to ({new})."
)
TOP_P_RANGE = "Assertion failed: topP.value() <= 1.f"
TOP_K_NEGATIVE = "Assertion failed: topK.value() >= 0"
# The [2, L] stop/bad word list's checks (upstream-facts: contract-word-list-checks).
WORD_LIST_ODD = "Sparse list must not have odd length: {list}"
WORD_LIST_EXTRA_END = "Sparse list must not have additional -1s: {list}"
WORD_LIST_OUT_OF_BOUND = "Sparse list must not have out-of-bound offsets: {list}"
WORD_LIST_NOT_INCREASING = "Sparse list must not have non-increasing offsets: {list}"
# The stand-in's own, stricter checks, where the backend silently does what a caller did not mean or fails in a kernel
# (upstream-facts: contract-input-lengths-ignored).
INPUT_LENGTHS_MISMATCH = (
    "input_lengths {n} does not match input_ids ({m} tokens); send input_lengths = the number of tokens in input_ids"
)
OUTPUT_LEN_INVALID = "request_output_len must be >= 1, got {n}"
TEMPERATURE_NOT_FINITE = "temperature must be a finite number >= 0, got {t}"
TOKEN_OUT_OF_VOCAB = (
    "{name} holds token id {t} outside the vocabulary [0, {v}); send ids the model's tokenizer produced"
)
END_ID_OUT_OF_VOCAB = "end_id {t} is outside [-1, {v}) (the vocabulary); send the tokenizer's EOS id or -1"
SEED_RANGE = "seed {s} is outside 0..2^64-1 (the backend's UINT64 seed)"
# Stricter than the backend, which would fan the request out into N child requests.
RETURN_SEQUENCES = (
    "num_return_sequences {n} is not supported by trt-spec's deployment (beam width 1, one "
    "sequence per request); send 1 or omit it"
)


def generation_logits_cache_bytes(max_batch_size: int, vocab_size: int, logits_dtype: str = LOGITS_DTYPE) -> int:
    """Upper bound of the GPU bytes per last-pipeline-stage rank that --gather_generation_logits costs."""
    return 2 * GENERATION_LOGITS_CACHE_STEPS * max_batch_size * vocab_size * (2 if logits_dtype == FP16_LOGITS else 4)


def max_input_len(max_seq_len: int, max_num_tokens: int, chunked_context: bool = False) -> int:
    """The longest prompt the executor takes; --max_input_len does not raise it.

    (upstream-facts: executor-max-input-len)"""
    return max_seq_len - 1 if chunked_context else min(max_seq_len - 1, max_num_tokens)


@dataclass(frozen=True)
class EngineLimits:
    """What a built engine fixes: its build_config (config.json, or the reference engine's trt_spec_engine.json)."""

    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int
    max_draft_len: int = 0
    max_beam_width: int = 1
    speculative_decoding_mode: Optional[str] = None
    gather_generation_logits: bool = False
    vocab_size: Optional[int] = None  # when known, token ids are range-checked
    logits_dtype: str = LOGITS_DTYPE

    @classmethod
    def from_build_config(cls, bc: Mapping, vocab_size: Optional[int] = None) -> "EngineLimits":
        return cls(
            int(bc["max_batch_size"]),
            int(bc["max_seq_len"]),
            int(bc["max_num_tokens"]),
            int(bc.get("max_draft_len", 0)),
            int(bc.get("max_beam_width", 1)),
            bc.get("speculative_decoding_mode"),
            bool(bc.get("gather_generation_logits", False)),
            vocab_size,
            bc.get("logits_dtype", LOGITS_DTYPE),
        )

    def input_limit(self, chunked_context: bool = False) -> int:
        return max_input_len(self.max_seq_len, self.max_num_tokens, chunked_context)

    def output_limit(self, prompt_len: int) -> int:
        """The most new tokens a request of prompt_len gets (OUTPUT_LEN_CLAMPED)."""
        return self.max_seq_len - prompt_len - self.max_draft_len


def kernel_logits(logits, temperature: Optional[float], logits_dtype: str):
    """The logits TensorRT-LLM samples from, as float32: `logits` [..., V] (torch) in the engine's logits dtype,
    scaled when a temperature other than 1 was sent, then clamped to the dtype's range."""
    import torch

    half = logits_dtype == FP16_LOGITS
    x = logits.to(torch.float16).float() if half else logits.float()
    if temperature is not None and abs(temperature - 1.0) > 1e-9:
        x = x * (1.0 / (float(temperature) + TEMPERATURE_EPS))
    if half:
        x = x.clamp(-HALF_MAX, HALF_MAX).to(torch.float16).float()
    return x


def effective_top_k_top_p(top_k: Optional[int], top_p: Optional[float]) -> tuple[int, float]:
    """The (top_k, top_p) TensorRT-LLM samples with: neither set means k = 1, GREEDY at any temperature.

    (upstream-facts: trtllm-top-k-top-p-default)"""
    k = int(top_k or 0)
    p = float(top_p) if top_p is not None and top_p > 0 else 0.0
    if k == 0 and p == 0.0:
        k = 1
    return k, p


@dataclass
class EngineRequest:
    """One request as the executor sees it, after the checks."""

    input_ids: list[int]
    output_len: int
    draft_tokens: list[int] = field(default_factory=list)
    draft_logits: Optional[np.ndarray] = None  # [k, V]
    end_id: Optional[int] = None  # absent: -1, never stops on EOS
    streaming: bool = False
    exclude_input: bool = False
    temperature: Optional[float] = None  # as sent; None = absent (logits unscaled)
    top_k: int = 1  # effective; 1 = greedy
    top_p: float = 0.0
    seed: Optional[int] = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    return_generation_logits: bool = False
    return_perf_metrics: bool = False
    requested_outputs: tuple[str, ...] = ()
    warning: Optional[str] = None  # OUTPUT_LEN_CLAMPED as the executor logs it

    @property
    def greedy(self) -> bool:
        """Top-k 1: the argmax of kernel_logits at any temperature."""
        return self.top_k == 1


def _scalar(inputs: Mapping[str, Optional[np.ndarray]], name: str):
    a = inputs.get(name)
    if a is None:
        return None
    flat = np.asarray(a).reshape(-1)
    if flat.size != 1:
        raise ContractError(INVALID_SIZE.format(name=name))
    v = flat[0]
    return v.item() if hasattr(v, "item") else v


def word_list(arr: Optional[np.ndarray]) -> list[list[int]]:
    """TensorRT-LLM's [2, L] word list (row 0 ids, row 1 end offsets, -1 padded) -> token sequences, checked."""
    if arr is None:
        return []
    flat = [int(x) for x in np.asarray(arr).reshape(-1)]
    shown = " ".join(str(x) for x in flat)
    if len(flat) % 2:
        raise ContractError(WORD_LIST_ODD.format(list=shown))
    n = len(flat) // 2
    ids, offsets = flat[:n], flat[n:]
    words, start = [], 0
    for i, end in enumerate(offsets):
        if end == -1:
            if any(o != -1 for o in offsets[i + 1 :]):
                raise ContractError(WORD_LIST_EXTRA_END.format(list=shown))
            break
        if end > n:
            raise ContractError(WORD_LIST_OUT_OF_BOUND.format(list=shown))
        if i > 0 and end <= offsets[i - 1]:
            raise ContractError(WORD_LIST_NOT_INCREASING.format(list=shown))
        words.append(ids[start:end])
        start = max(start, end)
    return [w for w in words if w]


def word_list_array(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Token sequences -> TensorRT-LLM's [2, L] word list (inverse of word_list)."""
    ids: list[int] = []
    offsets: list[int] = []
    for w in words:
        if len(w):
            ids += [int(t) for t in w]
            offsets.append(len(ids))
    out = np.full((2, max(1, len(ids))), -1, dtype=np.int32)
    if ids:
        out[0, : len(ids)] = ids
        out[1, : len(offsets)] = offsets
    else:
        out[0, 0] = 0
    return out


def parse_request(
    inputs: Mapping[str, Optional[np.ndarray]],
    requested_outputs: Iterable[str],
    limits: EngineLimits,
    params: Mapping[str, str],
    *,
    decoupled: bool,
    config_logits_dtype: str = LOGITS_DTYPE,
) -> EngineRequest:
    """The backend's and executor's checks of the inputs trt-spec uses, in their order; raises ContractError.

    `inputs`: name -> array with the batch dimension ([1, …])."""
    input_ids, streaming = _input_ids(inputs, decoupled)
    out_len = _output_len(inputs, limits)
    temperature, k, p = _sampling(inputs)
    exclude = _scalar(inputs, EXCLUDE_INPUT_IN_OUTPUT)
    if exclude is None:
        exclude = parse_bool(parameter(params, EXCLUDE_INPUT_IN_OUTPUT), EXCLUDE_INPUT_IN_OUTPUT)
    draft = inputs.get(DRAFT_INPUT_IDS)
    draft_tokens = [int(x) for x in np.asarray(draft).reshape(-1)] if draft is not None else []
    out_len, warning = _validate_lengths(input_ids, out_len, draft_tokens, limits)
    return_logits = bool(_scalar(inputs, RETURN_GENERATION_LOGITS) or False)
    if return_logits and not limits.gather_generation_logits:
        raise ContractError(EXECUTOR_ERROR.format(msg=NO_GENERATION_LOGITS))
    requested = tuple(requested_outputs)
    for name in MANDATORY_OUTPUTS:
        if name not in requested:
            raise ContractError(MISSING_OUTPUT.format(name=name))
    dl = inputs.get(DRAFT_LOGITS)
    if (dl is not None or return_logits) and limits.logits_dtype != config_logits_dtype:
        raise ContractError(LOGITS_DTYPE_MISMATCH.format(engine=limits.logits_dtype, config=config_logits_dtype))
    end_id = _scalar(inputs, END_ID)
    seed = _scalar(inputs, SEED)
    if seed is not None and not 0 <= int(seed) < 2**64:
        raise ContractError(SEED_RANGE.format(s=int(seed)))
    _check_vocabulary(limits.vocab_size, input_ids, draft_tokens, end_id)
    return EngineRequest(
        input_ids=input_ids,
        output_len=int(out_len),
        draft_tokens=draft_tokens,
        draft_logits=None if dl is None else np.asarray(dl).reshape(-1, np.asarray(dl).shape[-1]),
        end_id=None if end_id is None else int(end_id),
        streaming=streaming,
        exclude_input=bool(exclude),
        temperature=None if temperature is None else float(temperature),
        top_k=k,
        top_p=p,
        seed=None if seed is None else int(seed),
        stop_words=word_list(inputs.get(STOP_WORDS_LIST)),
        bad_words=word_list(inputs.get(BAD_WORDS_LIST)),
        return_generation_logits=return_logits,
        return_perf_metrics=bool(_scalar(inputs, RETURN_PERF_METRICS) or False),
        requested_outputs=requested,
        warning=warning,
    )


def _input_ids(inputs: Mapping[str, Optional[np.ndarray]], decoupled: bool) -> tuple[list[int], bool]:
    """The prompt (one sequence) and the streaming flag."""
    ids = inputs.get(INPUT_IDS)
    if ids is None:
        raise ContractError(NO_INPUT_IDS)
    ids = np.asarray(ids)
    if ids.ndim >= 2 and ids.shape[0] > 1 and not decoupled:
        raise ContractError(BATCH_NEEDS_DECOUPLED)
    if ids.ndim >= 2 and ids.shape[0] > 1:
        raise ContractError(
            f"batch of {ids.shape[0]} sequences in one request: trt-spec's engines take one "
            "sequence per request; send one request per prompt"
        )
    streaming = bool(_scalar(inputs, STREAMING) or False)
    if streaming and not decoupled:
        raise ContractError(STREAMING_NEEDS_DECOUPLED)
    input_ids = [int(x) for x in ids.reshape(-1)]
    if not input_ids:
        raise ContractError(EMPTY_INPUT)
    n_in = _scalar(inputs, INPUT_LENGTHS)
    if n_in is not None and int(n_in) != len(input_ids):
        raise ContractError(INPUT_LENGTHS_MISMATCH.format(n=int(n_in), m=len(input_ids)))
    return input_ids, streaming


def _output_len(inputs: Mapping[str, Optional[np.ndarray]], limits: EngineLimits):
    """request_output_len as sent, before the executor clamps it."""
    out_len = _scalar(inputs, REQUEST_OUTPUT_LEN)
    if out_len is None:
        raise ContractError(NO_OUTPUT_LEN)
    if int(out_len) < 1:
        raise ContractError(OUTPUT_LEN_INVALID.format(n=int(out_len)))
    num_seq = _scalar(inputs, "num_return_sequences")
    if num_seq is not None and int(num_seq) != 1:
        raise ContractError(RETURN_SEQUENCES.format(n=int(num_seq)))
    beam = _scalar(inputs, "beam_width")
    if beam is not None and not 0 < int(beam) <= limits.max_beam_width:
        raise ContractError(EXECUTOR_ERROR.format(msg=BEAM_WIDTH.format(n=int(beam), max=limits.max_beam_width)))
    return out_len


def _sampling(inputs: Mapping[str, Optional[np.ndarray]]):
    """Temperature as sent, and the effective (top_k, top_p)."""
    temperature = _scalar(inputs, TEMPERATURE)
    top_p = _scalar(inputs, RUNTIME_TOP_P)
    if temperature is not None and not float(temperature) >= 0:  # NaN fails too
        raise ContractError(TEMPERATURE_NEGATIVE)
    if temperature is not None and not math.isfinite(float(temperature)):
        raise ContractError(TEMPERATURE_NOT_FINITE.format(t=float(temperature)))
    if top_p is not None and (not math.isfinite(float(top_p)) or float(top_p) > 1):
        raise ContractError(TOP_P_RANGE)
    top_k = _scalar(inputs, RUNTIME_TOP_K)
    if top_k is not None and int(top_k) < 0:
        raise ContractError(TOP_K_NEGATIVE)
    k, p = effective_top_k_top_p(top_k, top_p)
    return temperature, k, p


def _validate_lengths(input_ids: list[int], out_len, draft_tokens: list[int], limits: EngineLimits):
    """(output length clamped to the room left, the executor's warning or None); raises on too long a prompt/draft."""
    if len(input_ids) > limits.input_limit():
        raise ContractError(
            EXECUTOR_ERROR.format(msg=PROMPT_TOO_LONG.format(n=len(input_ids), max=limits.input_limit()))
        )
    warning = None
    if int(out_len) > limits.output_limit(len(input_ids)):
        room = limits.output_limit(len(input_ids))
        warning = OUTPUT_LEN_CLAMPED.format(
            p=len(input_ids), n=int(out_len), d=limits.max_draft_len, max=limits.max_seq_len, new=room
        )
        if room < 1:  # stricter than the executor, which would go on with no room
            raise ContractError(EXECUTOR_ERROR.format(msg=warning.replace("is changed to", "would be")))
        out_len = room
    if draft_tokens and len(draft_tokens) > limits.max_draft_len:
        raise ContractError(
            EXECUTOR_ERROR.format(msg=DRAFT_TOO_LONG.format(n=len(draft_tokens), max=limits.max_draft_len))
        )
    return out_len, warning


def _check_vocabulary(v: Optional[int], input_ids: list[int], draft_tokens: list[int], end_id) -> None:
    """Every token id inside the vocabulary v (None: unchecked)."""
    if v is None:
        return
    for name, toks in ((INPUT_IDS, input_ids), (DRAFT_INPUT_IDS, draft_tokens)):
        bad = next((t for t in toks if not 0 <= t < v), None)
        if bad is not None:
            raise ContractError(TOKEN_OUT_OF_VOCAB.format(name=name, t=bad, v=v))
    if end_id is not None and not -1 <= int(end_id) < v:
        raise ContractError(END_ID_OUT_OF_VOCAB.format(t=int(end_id), v=v))


@dataclass(frozen=True)
class PerfOutputs:
    """One response's perf metrics, as the backend writes them (PERF_OUTPUT_TYPES)."""

    kv_new_blocks: int = 0
    kv_reused_blocks: int = 0
    kv_total_blocks: int = 0
    arrival_ns: int = 0
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    accepted: int = 0
    drafted: int = 0

    def tensors(self) -> dict[str, np.ndarray]:
        values = (
            self.kv_new_blocks,
            self.kv_reused_blocks,
            self.kv_total_blocks,
            self.arrival_ns,
            self.first_scheduled_ns,
            self.first_token_ns,
            self.last_token_ns,
            self.accepted / self.drafted if self.drafted else 0.0,
            self.accepted,
            self.drafted,
        )
        np_types = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}
        return {name: np.asarray([[v]], dtype=np_types[t]) for (name, t), v in zip(PERF_OUTPUT_TYPES.items(), values)}


def response_tensors(
    req: EngineRequest,
    tokens: Sequence[int],
    *,
    perf: PerfOutputs = PerfOutputs(),
    logits: Optional[np.ndarray] = None,
    declared: Optional[Iterable[str]] = None,
    model: str = "tensorrt_llm",
) -> dict[str, np.ndarray]:
    """One response's requested outputs in the backend's shapes; output_ids [1, 1, T] holds the prompt only when
    neither streaming nor exclude_input. Raises ContractError on an output `declared` lacks (UNDECLARED_OUTPUT)."""
    ids = list(tokens) if (req.streaming or req.exclude_input) else list(req.input_ids) + list(tokens)
    out = {
        OUTPUT_IDS: np.asarray(ids, dtype=np.int32).reshape(1, 1, -1),
        SEQUENCE_LENGTH: np.asarray([[len(ids)]], dtype=np.int32),
    }
    if logits is not None and req.return_generation_logits and GENERATION_LOGITS in req.requested_outputs:
        out[GENERATION_LOGITS] = np.asarray(logits, dtype=np.float32)[None, None]
    if req.return_perf_metrics:
        out.update(perf.tensors())
    if declared is not None:
        have = set(declared)
        missing = next((name for name in out if name not in have), None)
        if missing is not None:
            raise ContractError(UNDECLARED_OUTPUT.format(name=missing, model=model))
    return {name: value for name, value in out.items() if name in req.requested_outputs}
