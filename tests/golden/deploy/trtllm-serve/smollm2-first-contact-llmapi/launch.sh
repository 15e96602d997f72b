#!/usr/bin/env bash
# trtllm-serve for smollm2-first-contact-llmapi: written by trt-spec 0.1.0 deploy trtllm-serve from <REPO>/build_configs/smollm2-first-contact-llmapi.yaml
# (config 29e649652daf); regenerate rather than edit. draft_target speculation inside TensorRT-LLM 1.2.1's
# LLM API, TP1 x PP1 = 1 GPU(s); the LLM's arguments: extra_llm_api_options.yaml.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec trtllm-serve <REPO>/build/smollm2-first-contact-llmapi/hf/target \
  --backend pytorch \
  --host 0.0.0.0 \
  --port 8000 \
  --tp_size 1 \
  --pp_size 1 \
  --max_batch_size 4 \
  --max_num_tokens 2048 \
  --max_seq_len 2048 \
  --kv_cache_free_gpu_memory_fraction 0.9 \
  --extra_llm_api_options "$HERE/extra_llm_api_options.yaml"
