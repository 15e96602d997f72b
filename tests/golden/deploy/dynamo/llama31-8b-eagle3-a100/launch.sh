#!/usr/bin/env bash
# Dynamo 1.6.1 for llama31-8b-eagle3-a100: written by trt-spec 0.1.0 deploy dynamo from <REPO>/build_configs/llama31-8b-eagle3-a100.yaml
# (config dbefc97d2e01); regenerate rather than edit. eagle3 speculation inside TensorRT-LLM's LLM API,
# TP1 x PP1 on 1 GPU(s) on this host; the LLM's arguments: extra-engine-args.yaml.
# Run inside nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.6.1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Discovery through a directory (--discovery-backend file), requests over TCP, events over ZMQ: no etcd,
# no NATS on one host.
export DYN_FILE_KV="${DYN_FILE_KV:-$(mktemp -d)}"
python3 -m dynamo.frontend \
  --http-port 8000 \
  --discovery-backend file &
FRONTEND=$!
trap 'kill "$FRONTEND" 2>/dev/null || true' EXIT
python3 -m dynamo.trtllm \
  --model /models/Llama-3.1-8B-Instruct \
  --served-model-name llama31-8b-eagle3-a100 \
  --extra-engine-args "$HERE/extra-engine-args.yaml" \
  --tensor-parallel-size 1 \
  --pipeline-parallel-size 1 \
  --discovery-backend file
