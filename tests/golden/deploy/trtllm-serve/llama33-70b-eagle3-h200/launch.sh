#!/usr/bin/env bash
# trtllm-serve for llama33-70b-eagle3-h200: written by trt-spec 0.1.0 deploy trtllm-serve from <REPO>/build_configs/llama33-70b-eagle3-h200.yaml
# (config 16d0f9c552e4); regenerate rather than edit. eagle3 speculation inside TensorRT-LLM 1.2.1's
# LLM API, TP1 x PP1 = 1 GPU(s); the LLM's arguments: extra_llm_api_options.yaml.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec trtllm-serve /models/Llama-3.3-70B-Instruct-FP8 \
  --backend pytorch \
  --host 0.0.0.0 \
  --port 8000 \
  --tp_size 1 \
  --pp_size 1 \
  --max_batch_size 8 \
  --max_num_tokens 8192 \
  --max_seq_len 8192 \
  --kv_cache_free_gpu_memory_fraction 0.9 \
  --extra_llm_api_options "$HERE/extra_llm_api_options.yaml"
