"""What trt-spec knows about TensorRT-LLM 1.2 itself: its version and image, the command-line surface of the
tools the plan calls, the architectures its engine flow builds, its speculative-decoding mode names, its
quantization formats, and the executor defaults trt-spec plans around.

Every flag the planner emits must be in these sets (the plan checks itself, and a contract test checks
every shipped config). Source: TensorRT-LLM 1.2 `trtllm-build --help`, `examples/quantization/quantize.py`,
`examples/models/core/*/convert_checkpoint.py`, `examples/medusa|eagle/convert_checkpoint.py`.
"""

from importlib import metadata
from typing import Optional

from ..records.speculation import TRTLLM_SPECULATIVE_MODES

TRTLLM_VERSION = "1.2.1"
# The first NGC Triton image whose TensorRT-LLM is 1.2.1 with the C++ `tensorrtllm` backend. Sources: Triton's
# compatibility matrix (triton-inference-server/server r26.04 docs/introduction/compatibility.md: 25.12-26.02 ship
# TensorRT-LLM 1.1.0, 26.03 ships 1.2.0, 26.04-26.07 ship 1.2.1) and tensorrtllm_backend r26.04
# dockerfile/Dockerfile.triton.trt_llm_backend (TENSORRTLLM_VER=1.2.1; r25.12 has 1.1.0). The image: Triton 2.68.0,
# Python 3.12 in the venv /opt/venv-tritonserver (first on PATH), CUDA 13.1, driver >= 590.
NGC_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"

# The engine path's end of line. TensorRT-LLM removed trtllm-build and the C++ `tensorrtllm` backend after the 1.2 line;
# NVIDIA stopped building the image that carries them after 26.07. Sources: triton-inference-server/server
# docs/introduction/compatibility.md at r26.08 (trtllm-python-py3 rows 26.04, 26.05, 26.06, 26.07: all TensorRT-LLM
# 1.2.1, TensorRT 10.14.1.48, torch 2.10.0a0+b4e4ee81d3.nv25.12, CUDA 13.1.0.036, driver 590.44.01) and server commit
# 6f460335a (2026-08-19: "No trtllm-python-py3 row: that container is not built for 26.08"); tensorrtllm_backend's last
# release branch is r26.07 (Dockerfile.triton.trt_llm_backend: TENSORRTLLM_VER=1.2.1 from release/1.2.1, as r26.04;
# its README there documents the PyTorch / LLM-API backend only, #852 and #858).
# Why the pin stays at 26.04 rather than 26.07: r26.04 -> r26.07 of tensorrtllm_backend changes the Dockerfile only by
# uninstalling opencv-python-headless (#859/#860; nothing trt-spec imports), but moves its `tensorrt_llm` submodule
# (the triton-inference-server/TensorRT-LLM fork that holds triton_backend/, the C++ backend and all_models the image
# copies) from 2fdb9e6 to ca88df0 (#857), and Triton core from 2.68 to 2.71. trt-spec's backend contract
# (records/backend_contract.py) and core behaviours (harness/phases.py) were read at r26.04; the fork's snapshot is too
# large to fetch here, so that diff is unread. 26.05-26.07 run trt-spec as far as the matrix shows (same TensorRT-LLM:
# `trt-spec doctor` accepts them), but the contract is checked against 26.04 only.
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
    """An installed distribution's version without importing it (importing tensorrt_llm loads torch and CUDA), or
    None. Names are normalized by importlib (tensorrt_llm == tensorrt-llm)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def trtllm_mismatch(installed: Optional[str] = None) -> Optional[str]:
    """One line when the installed TensorRT-LLM is not the version trt-spec targets (None when it is, or when none
    is installed: a CPU machine). `installed` defaults to what this interpreter sees."""
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
# examples/models/core/gemma/convert_checkpoint.py parse_arguments(): dashes, no --tp_size/--pp_size
# (Mapping(world_size=tp_size=--world-size, pp_size=1)); --ckpt-type has no default (required in effect).
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

# trt-spec speculative.mode -> the engine's --speculative_decoding_mode (one table, in speculation's vocabulary).
SPEC_MODE_TO_TRTLLM = TRTLLM_SPECULATIVE_MODES
# Which modes build a draft_tokens_external target (speculation.Mode.loop_in_bls) and which speculate inside the target
# engine (Mode.in_engine) is speculation's vocabulary, defined once there. A draft_tokens_external target: the executor
# refuses it without KV-cache block reuse (trtGptModelInflightBatching.cpp), and reuse needs paged context FMHA, which
# tensorrt_llm/builder.py turns off with an INT8 KV cache, and with an FP8 KV cache unless the weights are FP8 on
# SM >= 89. An in-engine mode has no per-request switch to turn speculation off (the decoding mode is the executor's),
# so its non-speculative baseline is an engine of its own (names.BASELINE_ENGINE behind the ensemble).
MEDUSA_DEFAULT_TREE_NODES = 63  # TRT-LLM's default tree (mc_sim_7b_63) has 63 nodes

# Architectures the TensorRT-LLM 1.2 engine flow (convert_checkpoint.py / quantize.py + trtllm-build) builds,
# mapped to the examples/models/core/<family> directory whose convert_checkpoint.py handles them.
TRTLLM_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma",
    "Phi3ForCausalLM": "phi",
}

# quantize.py --qformat values that run calibration, and the weight-only ones that do not.
QUANTIZE_CALIBRATED = {"fp8", "int8_sq", "int4_awq"}
QUANTIZE_WEIGHT_ONLY = {"int8_wo", "int4_wo"}
# 16-bit/32-bit weight formats -> convert_checkpoint.py --dtype.
DTYPE_FOR_FORMAT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

DEFAULT_KV_FRACTION = 0.9  # the executor's default share of free memory for the KV cache
