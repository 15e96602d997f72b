#!/usr/bin/env bash
# Dynamo 1.6.1 for deepseek-v3-mtp-h100-2node: written by trt-spec 0.1.0 deploy dynamo from <REPO>/build_configs/deepseek-v3-mtp-h100-2node.yaml
# (config 735ac6a0e295); regenerate rather than edit. mtp speculation inside TensorRT-LLM's LLM API,
# TP16 x PP1 on 2 nodes of 8 GPUs; the LLM's arguments: extra-engine-args.yaml.
# Run inside nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# One worker over 2 nodes is one MPI world: every rank runs trtllm-llmapi-launch, rank 0 the
# Dynamo worker. Inside a Slurm allocation of those nodes, with the image, the checkpoints and this
# directory at the same paths on all of them, and an etcd every node reaches (discovery across hosts).
: "${ETCD_ENDPOINTS:?set ETCD_ENDPOINTS=HOST:2379, an etcd every node reaches}"
python3 -m dynamo.frontend \
  --http-port 8000 \
  --discovery-backend etcd &
FRONTEND=$!
trap 'kill "$FRONTEND" 2>/dev/null || true' EXIT
srun -N 2 --ntasks 16 --ntasks-per-node 8 --mpi=pmix trtllm-llmapi-launch python3 -m dynamo.trtllm \
  --model /models/DeepSeek-V3 \
  --served-model-name deepseek-v3-mtp-h100-2node \
  --extra-engine-args "$HERE/extra-engine-args.yaml" \
  --tensor-parallel-size 16 \
  --pipeline-parallel-size 1 \
  --discovery-backend etcd
