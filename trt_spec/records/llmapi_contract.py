"""The LLM-API (PyTorch) runtime's Triton model, as trt-spec relies on it: one place for every name, with its source.

TensorRT-LLM's Triton model for the LLM API is `triton_backend/all_models/llmapi/tensorrt_llm/` (`config.pbtxt`,
`1/model.py`, `1/model.yaml`): a python model that builds `tensorrt_llm.LLM(**model.yaml minus triton_config)` and
serves text in, text out. Sources read (NVIDIA/TensorRT-LLM; the v1.2.1 tag itself could not be fetched here, so the
nearest stored commits of the 1.2 line were read — `trt-spec doctor` on the image and docs/serving.md's first-run
checklist confirm them on the pinned image):
- CFG   = triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @ c8c6df08
- MODEL = .../tensorrt_llm/1/model.py @ b35ac1b6 (version.py there: 1.2.0rc2); helpers.py
          get_sampling_params_from_request
- YAML  = .../tensorrt_llm/1/model.yaml @ c8c6df08
- ARGS  = tensorrt_llm/llmapi/llm_args.py of the 1.2 line: DecodingBaseConfig.from_dict, EagleDecodingConfig,
          NGramDecodingConfig, DraftTargetDecodingConfig, MTPDecodingConfig, KvCacheConfig, CudaGraphConfig,
          TorchLlmArgs. The later `Eagle3DecodingConfig` (decoding_type "Eagle3") is NOT in this line: EAGLE-3 is
          `decoding_type: Eagle` with `eagle3_one_model` (True = one model, False = two models).
- SUPPORT = tensorrt_llm/llmapi/model_support_matrix.py @ 11d64858 and docs/source/features/speculative-decoding.md
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_NAME = "tensorrt_llm"  # CFG L27: the model's name in NVIDIA's repository (its documented curl uses it)
BASELINE_MODEL = "tensorrt_llm_baseline"  # trt-spec's: the same target without speculative_config (identity, speedup)
BACKEND = "python"  # CFG L28
YAML_FILE = "model.yaml"  # MODEL get_model_config: os.environ.get("LLM_CONFIG_PATH", "model.yaml") in the model dir
TRITON_KEY = "triton_config"  # MODEL: popped from model.yaml; the rest goes to LLM(**kwargs)
TRITON_KEYS = ("max_batch_size", "decoupled", "cancellation_check_period_ms")  # MODEL auto_complete_config/initialize


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = True


# CFG inputs: every one optional but text_input. No end_id / pad_id / stop-word-id inputs: the LLM API tokenizes and
# stops by itself (sampling_param_stop are strings, which NVIDIA's model cannot pass on: STOP_INPUT below).
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
    Tensor("stop", "TYPE_BOOL", (1,)),  # MODEL handle_stop_request: abort every request of this request id
)
# CFG outputs. The perf outputs are declared numeric but MODEL _create_response encodes them as strings (JSON shows
# "0.0"): a client must parse them.
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
# What TensorRT-LLM 1.2.1 answers in them (checked at the nearest stored 1.2-line commits; the v1.2.1 tag is too large
# to fetch here):
# - MODEL _create_response fills acceptance_rate / total_accepted_draft_tokens / total_draft_tokens from
#   request_perf_metrics.speculative_decoding, whose only writer is C++ LlmRequest::updateNumTokensPerIteration, called
#   by the TRT engine runtime and the TRTLLMSampler but never by the PyTorch flow's TorchSampler: on this runtime they
#   are 0 whenever drafting ran (NVIDIA/TensorRT-LLM#17082, "Populate speculative-decoding request perf metrics in the
#   PyTorch one-engine flow", merged 2026-07-30, after 1.2.1). RequestOutput.avg_decoded_tokens_per_iter is right, but
#   MODEL does not return it. The stand-in answers 0 (SPEC_PERF_ZERO); the harness derives acceptance from the streamed
#   responses instead (harness/client.py LLMClient._llmapi_result) and says so (ACCEPTANCE_SOURCE).
# - Each streamed response's text_output is the whole text so far, not a delta: MODEL sends CompletionOutput.text, which
#   tensorrt_llm/executor/result.py accumulates (DetokenizedGenerationResultBase: `text` = decode_incrementally(...,
#   prev_text=text); `text_diff` is the delta), one response per executor response: one per iteration.
SPEC_PERF_ZERO = True
# - sampling_param_stop cannot work through NVIDIA's model: helpers.py get_sampling_params_from_request passes the
#   input tensor itself as SamplingParams' `stop` (`kwargs['stop'] = get_input_tensor_by_name(request,
#   'sampling_param_stop')`, read at stored commit 0df60f9a: a numpy array of the tensor's BYTES elements, undecoded —
#   unlike its LoRA inputs, which it decodes), and SamplingParams._setup tokenizes each element as text
#   (`tokenizer.encode(s, ...)`, tensorrt_llm/sampling_params.py @ 000a01de): Hugging Face tokenizers refuse bytes
#   ("text input must be of type `str`"), so the request fails with GENERATION_ERROR. NVIDIA's own unit test of
#   helpers.py mocks the tensor with a unicode array, which is not what Triton's python backend hands the model.
#   trt-spec never sends it: the OpenAI frontend and the harness cut stop strings from the text themselves and end the
#   call; the stand-in refuses it.
STOP_INPUT = "sampling_param_stop"
STOP_REFUSED = (
    "sampling_param_stop: SamplingParams tokenizes each stop string as text, but the model passes the input's bytes "
    "undecoded (helpers.py get_sampling_params_from_request) and the tokenizer refuses bytes; cut stop strings from "
    "text_output in the client instead"
)
ACCEPTANCE_SOURCE = "acceptance_source"  # the harness's metric naming where acceptance came from
FROM_PERF_OUTPUTS = "the model's perf outputs"
FROM_STREAMED_CHUNKS = (
    "streamed responses: tokens per response = tokens per iteration (avg_decoded_tokens_per_iter, "
    "the first iteration included; a stream_interval above 1, fewer responses than iterations, "
    "would overstate it); TensorRT-LLM 1.2.1 reports 0 accepted/drafted on the PyTorch flow "
    "(NVIDIA/TensorRT-LLM#17082)"
)
ACCEPTANCE_NOTE = "acceptance_note"  # the harness's metric naming a correction to FROM_STREAMED_CHUNKS' count
STREAM_CUT = (
    "a stop string cut the final text: accepted tokens counted up to the longest streamed text (the stop "
    "string's own tokens are not seen: a low bound)"
)
STREAM_CLAMPED = "fewer tokens than streamed responses: accepted tokens clamped at 0"
TEXT_INPUT, TEXT_OUTPUT, STREAMING = "text_input", "text_output", "streaming"
MAX_TOKENS = "sampling_param_max_tokens"
EXCLUDE_INPUT = "sampling_param_exclude_input_from_output"  # MODEL default False: text_output includes the prompt
RETURN_PERF = "sampling_param_return_perf_metrics"  # MODEL default False
SAMPLING_PREFIX = "sampling_param_"  # MODEL: sampling_param_X -> SamplingParams(X=...)

# MODEL's errors, its own words
STREAMING_NEEDS_DECOUPLED = "Streaming is only supported in decoupled mode."
NO_TEXT_INPUT = "text_input is missing from the request"
GENERATION_ERROR = "Error generating request: {msg}"  # every other failure; text_output ["N/A"] with it
CANCELLED = "Request cancelled by client"  # cancellation_loop, TritonError CANCELLED

# ARGS: speculative_config's decoding_type per trt-spec mode (DecodingBaseConfig.from_dict's keys in the 1.2 line).
DECODING_TYPES = {"draft_target": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle", "mtp": "MTP"}
# ARGS field names trt-spec writes
SPEC_MODEL_DIR = "speculative_model_dir"  # DecodingBaseConfig (DraftTarget, Eagle)
EAGLE3_ONE_MODEL = "eagle3_one_model"  # EagleDecodingConfig, default True
NUM_NEXTN = "num_nextn_predict_layers"  # MTPDecodingConfig (max_draft_len = it, from_dict)
NGRAM_MATCH = "max_matching_ngram_size"  # NGramDecodingConfig
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
KV_CACHE_KEYS = ("free_gpu_memory_fraction", "enable_block_reuse", "dtype")  # KvCacheConfig
CUDA_GRAPH_KEYS = ("max_batch_size", "enable_padding")  # CudaGraphConfig
# TorchLlmArgs has no quant_config field (TrtLlmArgs only): FP8 weights come from a pre-quantized checkpoint (its
# config.json quantization_config), FP8 KV cache from kv_cache_config.dtype "fp8".

# SUPPORT: EAGLE-3 one-model / two-model and MTP per architecture (config.json `architectures[0]`). Llama 3.x is in
# the speculative-decoding docs' two-model table and in TensorRT-LLM's own test of Llama-3.3-70B-Instruct with
# EAGLE3-LLaMA3.3-Instruct-70B (eagle3_one_model True and False). MTP is DeepSeek-V3's family only.
EAGLE3_SUPPORT: dict[str, tuple[bool, bool]] = {  # architecture -> (one-model, two-model)
    "LlamaForCausalLM": (True, True),
    "Llama4ForConditionalGeneration": (True, True),
    "Qwen3ForCausalLM": (True, True),
    "Qwen3MoeForCausalLM": (True, True),
    "GptOssForCausalLM": (True, True),
}
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM")

# trtllm-serve (TensorRT-LLM's OpenAI server over the same LLM arguments; `trt-spec deploy trtllm-serve`). The v1.2.1
# tag is too large to fetch here; read at stored versions of NVIDIA/TensorRT-LLM on both sides of the 1.2 line:
# - SERVE = tensorrt_llm/commands/serve.py: an earlier stored version (options --tp_size, --pp_size, --ep_size,
#   --kv_cache_free_gpu_memory_fraction, --extra_llm_api_options as their own names) and @ 00209af1 (later: the same
#   names kept as aliases of --tensor_parallel_size, --pipeline_parallel_size, --moe_expert_parallel_size,
#   --free_gpu_memory_fraction, and `--config` added as an alias of --extra_llm_api_options). Every flag below is
#   accepted by both, so by the 1.2 line between them. MODEL is positional; --backend defaults to pytorch, --host to
#   localhost, --port to 8000.
# - MERGE = tensorrt_llm/llmapi/llm_args.py update_llm_args_with_extra_dict (the 1.2-era stored version):
#   `llm_args | yaml_dict`, top-level keys of the YAML replace what the flags set (kv_cache_config as a whole). Later
#   docs (docs/source/commands/trtllm-serve/trtllm-serve.rst @ 0434755f) say explicit flags win instead. trt-spec
#   writes the same numbers in both places, so either precedence serves the same plan.
# - LAUNCH = tensorrt_llm/llmapi/trtllm-llmapi-launch @ 020c89e6 (installed as a script by setup.py): under mpirun or
#   srun, rank 0 (OMPI_COMM_WORLD_RANK / SLURM_PROCID) runs the command with the MPI environment cleared and the
#   other ranks join as mgmn worker nodes; the trtllm-serve docs' multi-node example runs it under
#   `srun -N 2 --ntasks 16 --ntasks-per-node=8 --mpi=pmix`.
# - SERVER = tensorrt_llm/serve/openai_server.py: the served model name is MODEL's directory name when MODEL is a
#   local directory (the earlier SERVE version has no --served_model_name; trt-spec passes none).
TRTLLM_SERVE_PORT = 8000  # SERVE --port default
# trt-spec's --host: every interface (a container's published port reaches it; SERVE's default localhost would not)
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
TRTLLM_LLMAPI_LAUNCH = "trtllm-llmapi-launch"  # LAUNCH
