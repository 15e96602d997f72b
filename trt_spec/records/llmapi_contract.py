"""The names trt-spec relies on in TensorRT-LLM's LLM-API (PyTorch) Triton model and trtllm-serve.

NVIDIA's python model builds `tensorrt_llm.LLM(**model.yaml minus triton_config)` and serves text in, text out
(upstream-facts: llmapi-model-sources, llmapi-model-details).
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_NAME = "tensorrt_llm"  # NVIDIA's name; its documented curl uses it
BASELINE_MODEL = "tensorrt_llm_baseline"  # the same target without speculative_config
BACKEND = "python"
YAML_FILE = "model.yaml"  # unless LLM_CONFIG_PATH is set
TRITON_KEY = "triton_config"  # popped from model.yaml; the rest goes to LLM(**kwargs)
TRITON_KEYS = ("max_batch_size", "decoupled", "cancellation_check_period_ms")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = True


# Every input optional but text_input; the LLM API tokenizes and stops by itself.
INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,), optional=False),
    Tensor("streaming", "TYPE_BOOL", (1,)),
    Tensor("sampling_param_best_of", "TYPE_INT32", (1,)),
    Tensor("sampling_param_temperature", "TYPE_FP32", (1,)),
    Tensor("sampling_param_top_k", "TYPE_INT32", (1,)),
    Tensor("sampling_param_top_p", "TYPE_FP32", (1,)),
    Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,)),
    Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,)),
    Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,)),
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,)),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,)),
    Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,)),
    Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,)),
    Tensor("return_finish_reason", "TYPE_BOOL", (1,)),
    Tensor("return_stop_reason", "TYPE_BOOL", (1,)),
    Tensor("return_cumulative_logprob", "TYPE_BOOL", (1,)),
    Tensor("stop", "TYPE_BOOL", (1,)),  # aborts every request of this request id
)
# Declared numeric but sent as strings ("0.0"): a client must parse them.
PERF_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)
OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("stop_reason", "TYPE_STRING", (-1,)),
    Tensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    *PERF_OUTPUTS,
)
# On the PyTorch flow the speculative perf outputs are 0 whenever drafting ran, so the harness derives acceptance from
# the streamed responses, one per iteration, each carrying the whole text so far
# (upstream-facts: llmapi-spec-perf-zero, llmapi-streamed-text-cumulative).
SPEC_PERF_ZERO = True
# NVIDIA's model passes this input's bytes undecoded and the request fails, so trt-spec never sends it and the stand-in
# refuses it (upstream-facts: llmapi-stop-input-broken).
STOP_INPUT = "sampling_param_stop"
STOP_REFUSED = (
    "sampling_param_stop: SamplingParams tokenizes each stop string as text, but the model passes the input's bytes "
    "undecoded (helpers.py get_sampling_params_from_request) and the tokenizer refuses bytes; cut stop strings from "
    "text_output in the client instead"
)
ACCEPTANCE_SOURCE = "acceptance_source"  # harness metric: where acceptance came from
FROM_PERF_OUTPUTS = "the model's perf outputs"
FROM_STREAMED_CHUNKS = (
    "streamed responses: tokens per response = tokens per iteration (avg_decoded_tokens_per_iter, "
    "the first iteration included; a stream_interval above 1, fewer responses than iterations, "
    "would overstate it); TensorRT-LLM 1.2.1 reports 0 accepted/drafted on the PyTorch flow "
    "(NVIDIA/TensorRT-LLM#17082)"
)
ACCEPTANCE_NOTE = "acceptance_note"  # harness metric: a correction to FROM_STREAMED_CHUNKS' count
STREAM_CUT = (
    "a stop string cut the final text: accepted tokens counted up to the longest streamed text (the stop "
    "string's own tokens are not seen: a low bound)"
)
STREAM_CLAMPED = "fewer tokens than streamed responses: accepted tokens clamped at 0"
TEXT_INPUT, TEXT_OUTPUT, STREAMING = "text_input", "text_output", "streaming"
MAX_TOKENS = "sampling_param_max_tokens"
EXCLUDE_INPUT = "sampling_param_exclude_input_from_output"  # default False: text_output includes the prompt
RETURN_PERF = "sampling_param_return_perf_metrics"  # default False
SAMPLING_PREFIX = "sampling_param_"  # sampling_param_X -> SamplingParams(X=...)

# The model's errors, its own words
STREAMING_NEEDS_DECOUPLED = "Streaming is only supported in decoupled mode."
NO_TEXT_INPUT = "text_input is missing from the request"
GENERATION_ERROR = "Error generating request: {msg}"  # every other failure; text_output ["N/A"] with it
CANCELLED = "Request cancelled by client"  # TritonError CANCELLED

# speculative_config's decoding_type per trt-spec mode; EAGLE-3 is "Eagle" in the 1.2 line
# (upstream-facts: llmapi-decoding-types).
DECODING_TYPES = {"draft_target": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle", "mtp": "MTP"}
# LLM-API field names trt-spec writes
SPEC_MODEL_DIR = "speculative_model_dir"  # DraftTarget, Eagle
EAGLE3_ONE_MODEL = "eagle3_one_model"  # default True
NUM_NEXTN = "num_nextn_predict_layers"  # MTP: also its max_draft_len
NGRAM_MATCH = "max_matching_ngram_size"
# The same speculative_config under each TensorRT-LLM line trt-spec writes for: the 1.2 line (Triton's image,
# trtllm-serve) keys DecodingBaseConfig.from_dict on the names above; the 1.3 line (Dynamo 1.6.1 pins 1.3.0rc29) is a
# pydantic union keyed on each class's decoding_type Literal, and names the draft `speculative_model`
# (upstream-facts: llmapi-decoding-types, llmapi-decoding-types-1-3).
SPEC_NAMES = {
    "1.2": {"decoding_types": DECODING_TYPES, "model_key": SPEC_MODEL_DIR},
    "1.3": {
        "decoding_types": {"draft_target": "Draft_Target", "ngram": "NGram", "eagle3": "Eagle3", "mtp": "MTP"},
        "model_key": "speculative_model",
    },
}


def spec_names(trtllm_version: str) -> dict:
    """SPEC_NAMES' row for a TensorRT-LLM version ("1.3.0rc29" -> the 1.3 line's); KeyError for a line not in it."""
    return SPEC_NAMES[".".join(trtllm_version.split(".")[:2])]


def speculative_config_for(spec: dict, trtllm_version: str) -> dict:
    """A 1.2-line speculative_config (what the repository writes) under `trtllm_version`'s names, key order kept."""
    row, mode = spec_names(trtllm_version), {v: k for k, v in DECODING_TYPES.items()}[spec["decoding_type"]]
    out = {}
    for k, v in spec.items():
        if k == "decoding_type":
            v = row["decoding_types"][mode]
        out[row["model_key"] if k == SPEC_MODEL_DIR else k] = v
    return out


LLM_KEYS = (
    "model",
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_batch_size",
    "max_seq_len",
    "max_num_tokens",
    "kv_cache_config",
    "cuda_graph_config",
    "speculative_config",
    "return_perf_metrics",
)
KV_CACHE_KEYS = ("free_gpu_memory_fraction", "enable_block_reuse", "dtype")
CUDA_GRAPH_KEYS = ("max_batch_size", "enable_padding")
# No quant_config on the PyTorch runtime: FP8 weights come from a pre-quantized checkpoint, FP8 KV cache from
# kv_cache_config.dtype "fp8" (upstream-facts: llmapi-no-quant-config).

# By config.json `architectures[0]` (upstream-facts: llmapi-eagle3-mtp-support).
EAGLE3_SUPPORT: dict[str, tuple[bool, bool]] = {  # architecture -> (one-model, two-model)
    "LlamaForCausalLM": (True, True),
    "Llama4ForConditionalGeneration": (True, True),
    "Qwen3ForCausalLM": (True, True),
    "Qwen3MoeForCausalLM": (True, True),
    "GptOssForCausalLM": (True, True),
}
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")

# trtllm-serve (`trt-spec deploy trtllm-serve`): every flag below is accepted throughout the 1.2 line; trt-spec writes
# the same numbers in the flags and the YAML, so either precedence serves the same plan
# (upstream-facts: trtllm-serve-flags, trtllm-serve-yaml-merge, trtllm-serve-model-name).
TRTLLM_SERVE_PORT = 8000  # its --port default
# every interface: a container's published port does not reach the default localhost
TRTLLM_SERVE_HOST = "0.0.0.0"
TRTLLM_SERVE_FLAGS = frozenset(
    {
        "--backend",
        "--host",
        "--port",
        "--tp_size",
        "--pp_size",
        "--max_batch_size",
        "--max_num_tokens",
        "--max_seq_len",
        "--kv_cache_free_gpu_memory_fraction",
        "--extra_llm_api_options",
    }
)
TRTLLM_LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # (upstream-facts: trtllm-llmapi-launch)
