#!/usr/bin/env bash
# trtllm-serve for deepseek-v3-mtp-h100-2node: written by trt-spec 0.1.0 deploy trtllm-serve from <REPO>/build_configs/deepseek-v3-mtp-h100-2node.yaml
# (config 735ac6a0e295); regenerate rather than edit. mtp speculation inside TensorRT-LLM 1.2.1's
# LLM API, TP16 x PP1 = 16 GPU(s) on 2 nodes of 8; the LLM's arguments: extra_llm_api_options.yaml.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Every node: the image, the checkpoints and this directory at the same paths. LAUNCHER=srun (inside a
# Slurm allocation of 2 nodes) or LAUNCHER=mpirun with HOSTS=node0:8,node1:8,...
LAUNCHER="${LAUNCHER:-srun}"
if [ "$LAUNCHER" = mpirun ]; then : "${HOSTS:?set HOSTS=node0:8,node1:8,... for mpirun}"; fi
case "$LAUNCHER" in
  srun)
    exec srun -N 2 --ntasks 16 --ntasks-per-node 8 --mpi=pmix trtllm-llmapi-launch trtllm-serve /models/DeepSeek-V3 \
      --backend pytorch \
      --host 0.0.0.0 \
      --port 8000 \
      --tp_size 16 \
      --pp_size 1 \
      --max_batch_size 8 \
      --max_num_tokens 8192 \
      --max_seq_len 8192 \
      --kv_cache_free_gpu_memory_fraction 0.9 \
      --extra_llm_api_options "$HERE/extra_llm_api_options.yaml"
    ;;
  mpirun)
    exec mpirun -np 16 -H "$HOSTS" trtllm-llmapi-launch trtllm-serve /models/DeepSeek-V3 \
      --backend pytorch \
      --host 0.0.0.0 \
      --port 8000 \
      --tp_size 16 \
      --pp_size 1 \
      --max_batch_size 8 \
      --max_num_tokens 8192 \
      --max_seq_len 8192 \
      --kv_cache_free_gpu_memory_fraction 0.9 \
      --extra_llm_api_options "$HERE/extra_llm_api_options.yaml"
    ;;
  *) echo "LAUNCHER must be srun or mpirun, got $LAUNCHER" >&2; exit 2 ;;
esac
