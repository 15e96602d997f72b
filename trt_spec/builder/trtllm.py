"""What trt-spec knows about TensorRT-LLM 1.2: version and image, the flags of the tools the plan calls, the
architectures its engine flow builds, speculative modes, quantization formats and executor defaults.

Every flag the planner emits must be in these sets (upstream-facts: trtllm-tool-flags).
"""

from importlib import metadata
from typing import Optional

from ..records.speculation import TRTLLM_SPECULATIVE_MODES

TRTLLM_VERSION = "1.2.1"
# The first NGC Triton image with TensorRT-LLM 1.2.1 and the C++ backend (upstream-facts: ngc-image-26-04).
NGC_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"

# The engine path ends with the 1.2 line: no image carries trtllm-build and the C++ backend after 26.07
# (upstream-facts: trtllm-engine-path-end). The pin stays at 26.04, where the contract was read; 26.05-26.07 ship the
# same TensorRT-LLM but a different backend fork and core (upstream-facts: ngc-pin-26-04-not-26-07).
LAST_ENGINE_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
IMAGES_WITH_TARGET = ("26.04", "26.05", "26.06", "26.07")  # NGC trtllm-python-py3 tags shipping TRTLLM_VERSION
ENGINE_PATH_END = (
    f"frozen: TensorRT-LLM {TRTLLM_VERSION} is the last line with trtllm-build and the C++ tensorrtllm backend, and "
    f"{LAST_ENGINE_IMAGE} the last image with them (no trtllm-python-py3 image from 26.08; "
    f"{', '.join(IMAGES_WITH_TARGET)} all ship {TRTLLM_VERSION}, "
    f"trt-spec is checked on {NGC_IMAGE.rsplit(':', 1)[1]}). "
    "runtime: engine keeps working on those images with no new models or fixes; new deployments: runtime: llmapi "
    "(Triton's LLM-API model on the same images, or `trt-spec deploy trtllm-serve|dynamo` for TensorRT-LLM's LLM API "
    "outside Triton, where NVIDIA's development continues)"
)


def dist_version(dist: str) -> Optional[str]:
    """An installed distribution's version without importing it (tensorrt_llm loads torch and CUDA), or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def trtllm_mismatch(installed: Optional[str] = None) -> Optional[str]:
    """One line when the installed TensorRT-LLM is not TRTLLM_VERSION; None when it is or none is installed."""
    v = installed if installed is not None else dist_version("tensorrt_llm")
    if v is None or v == TRTLLM_VERSION:
        return None
    return (
        f"TensorRT-LLM {v} is installed, but trt-spec targets {TRTLLM_VERSION} (engines and the tensorrtllm "
        f"backend must match it); use the image {NGC_IMAGE}"
    )


TRTLLM_BUILD_FLAGS = frozenset(
    """
--checkpoint_dir --model_config --build_config --model_cls_file --model_cls_name --output_dir
--max_batch_size --max_input_len --max_seq_len --max_decoder_seq_len --max_beam_width --max_num_tokens
--opt_num_tokens --max_encoder_input_len --max_prompt_embedding_table_size --kv_cache_type --paged_kv_cache
--input_timing_cache --output_timing_cache --profiling_verbosity --strip_plan --weight_sparsity
--weight_streaming --fast_build --workers --log_level --enable_debug_output --visualize_network --dry_run
--monitor_memory --logits_dtype --gather_context_logits --gather_generation_logits --gather_all_token_logits
--lora_dir --lora_ckpt_source --lora_target_modules --max_lora_rank --speculative_decoding_mode
--max_draft_len --auto_parallel --gpus_per_node --cluster_key
--bert_attention_plugin --gpt_attention_plugin --gemm_plugin --gemm_swiglu_plugin --fp8_rowwise_gemm_plugin
--lora_plugin --dora_plugin --moe_plugin --mamba_conv1d_plugin --nccl_plugin --low_latency_gemm_plugin
--low_latency_gemm_swiglu_plugin --gemm_allreduce_plugin --context_fmha --bert_context_fmha_fp32_acc
--remove_input_padding --tokens_per_block --use_paged_context_fmha --use_fp8_context_fmha --fuse_fp4_quant
--multiple_profiles --paged_state --streamingllm --norm_quant_fusion --reduce_fusion --user_buffer
--use_fused_mlp --pp_reduce_scatter
""".split()
)

QUANTIZE_FLAGS = frozenset(
    """
--model_dir --nemo_ckpt_path --decoder_type --device --device_map --calib_dataset --calib_tp_size
--calib_pp_size --dtype --qformat --seed --tokenizer_max_seq_length --batch_size --calib_size
--calib_max_seq_length --output_dir --tp_size --pp_size --cp_size --awq_block_size --kv_cache_dtype
--quantize_lm_head --num_medusa_heads --num_medusa_layers --max_draft_len --medusa_hidden_act
--medusa_model_dir --quant_medusa_head --autoq_format --auto_quantize_bits
""".split()
)
QUANTIZE_QFORMATS = frozenset("nvfp4 fp8 fp8_pc_pt int8_sq int4_awq w4a8_awq int8_wo int4_wo full_prec".split())
QUANTIZE_KV_DTYPES = frozenset({"int8", "fp8"})

CONVERT_CHECKPOINT_FLAGS = frozenset("--model_dir --output_dir --dtype --tp_size --pp_size".split())
# llama's converter on a ModelOpt pre-quantized FP8 checkpoint (upstream-facts: trtllm-convert-prequantized-fp8)
PREQUANTIZED_CONVERT_FLAGS = CONVERT_CHECKPOINT_FLAGS | {"--use_fp8", "--fp8_kv_cache"}
# Gemma's converter: dashes, TP only, --ckpt-type required (upstream-facts: gemma-convert-flags).
GEMMA_CONVERT_FLAGS = frozenset("--ckpt-type --model-dir --output-model-dir --world-size --dtype".split())
MEDUSA_CONVERT_FLAGS = frozenset(
    "--model_dir --medusa_model_dir --output_dir --dtype --tp_size --pp_size --num_medusa_heads "
    "--num_medusa_layers --max_medusa_token_len --medusa_hidden_act".split()
)
EAGLE_CONVERT_FLAGS = frozenset(
    "--model_dir --eagle_model_dir --output_dir --dtype --tp_size --pp_size --max_draft_len --num_eagle_layers "
    "--max_non_leaves_per_layer".split()
)

SPECULATIVE_DECODING_MODES = frozenset(
    {"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"}
)

# trt-spec speculative.mode -> the engine's --speculative_decoding_mode.
SPEC_MODE_TO_TRTLLM = TRTLLM_SPECULATIVE_MODES
# A draft_tokens_external target needs KV-cache block reuse, so paged context FMHA
# (upstream-facts: draft-tokens-external-needs-reuse). In-engine modes cannot turn speculation off per request, so
# their baseline is an engine of its own.
MEDUSA_DEFAULT_TREE_NODES = 63  # TRT-LLM's default tree, mc_sim_7b_63

# Architectures the 1.2 engine flow builds -> the examples/models/core/<family> whose converter handles them.
TRTLLM_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi",
}

# quantize.py --qformat values that calibrate, and weight-only ones that do not.
QUANTIZE_CALIBRATED = {"fp8", "int8_sq", "int4_awq"}
QUANTIZE_WEIGHT_ONLY = {"int8_wo", "int4_wo"}
# unquantized weight formats -> convert_checkpoint.py --dtype
DTYPE_FOR_FORMAT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
