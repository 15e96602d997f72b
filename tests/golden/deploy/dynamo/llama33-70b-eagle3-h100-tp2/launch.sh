#!/usr/bin/env bash
# Dynamo 1.6.1 for llama33-70b-eagle3-h100-tp2: written by trt-spec 0.1.0 deploy dynamo from <REPO>/build_configs/llama33-70b-eagle3-h100-tp2.yaml
# (config 98b846cbceaf); regenerate rather than edit. eagle3 speculation inside TensorRT-LLM's LLM API,
# TP2 x PP1 on 2 GPU(s) on this host; the LLM's arguments: extra-engine-args.yaml.
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
  --model /models/Llama-3.3-70B-Instruct-FP8 \
  --served-model-name llama33-70b-eagle3-h100-tp2 \
  --extra-engine-args "$HERE/extra-engine-args.yaml" \
  --tensor-parallel-size 2 \
  --pipeline-parallel-size 1 \
  --discovery-backend file
