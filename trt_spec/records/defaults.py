"""Defaults shared by the code and the CLI's `--help`, one definition each.

Standard library only: the CLI imports this module at startup.
"""

from __future__ import annotations

from pathlib import Path

# -- Build
BUILD_ROOT = "build"  # a config without output_dir builds into BUILD_ROOT/NAME
TOKENS_PER_BLOCK = 32  # KV-cache block size: small blocks reuse more prefix
REPO_SUBDIR = "model_repo"  # the Triton model repository inside a build or demo dir
# quantize.py --batch_size: one calibration sequence per forward keeps its activations small beside the 16-bit weights
CALIB_BATCH_SIZE = 1


def served_num_draft_tokens(default_k: int, max_draft_len: int) -> int:
    """The k of a request that names none, capped at the engine's built max_draft_len."""
    return min(default_k, max_draft_len)


# -- The served python models
ADD_SPECIAL_TOKENS = True  # prompts are tokenized with the tokenizer's special tokens (BOS)
# The suffix proposer's cross-request cache, per store (one per tenant or per deployment): the last MAX_SEQUENCES
# finished requests, at most MAX_TOKENS tokens; at most MAX_TENANTS tenant stores.
SUFFIX_CACHE_SCOPE = "tenant"  # a request without a tenant neither reads nor writes it
SUFFIX_CACHE_MAX_TOKENS = 16384
SUFFIX_CACHE_MAX_SEQUENCES = 64
SUFFIX_CACHE_MAX_TENANTS = 32
SUFFIX_CACHE_MIN_MATCH = 2  # across requests a one-token match is close to noise
TENANT_MAX_BYTES = 256  # the longest tenant id a request may send
# The suffix proposer: a request's own text is matched from one token; how much of its proposal is verified is the
# draft-length policy's call from measured costs (draft_policy.RequestPolicy.proposal_len), no fixed rule.
SUFFIX_MIN_MATCH = 1

# -- Serving (trt-spec serve) and its clients
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002  # tritonserver's own defaults
HOST = "127.0.0.1"  # loopback: nothing is open to the network unless asked
READY_TIMEOUT_S = 180.0  # wait for every model to load: this, plus READY_S_PER_ENGINE_GIB per GiB of engine files
READY_S_PER_ENGINE_GIB = 6.0  # sized for a cold load from network storage
# serve starts tritonserver again when a python-backend stub starved of CPU failed its start (serve/server.py)
STUB_START_RESTARTS = 1


# llmapi on a GPU: CUDA-graph capture and kernel autotuning run before READY (not measured)
LLMAPI_READY_EXTRA_S = 300.0


def ready_timeout_s(engine_bytes: int = 0) -> float:
    """Seconds `trt-spec serve` waits for every model to load, given the engine files' total bytes."""
    return READY_TIMEOUT_S + READY_S_PER_ENGINE_GIB * engine_bytes / 2**30


def cache_dir() -> Path:
    """$TRT_SPEC_CACHE_DIR, else $XDG_CACHE_HOME/trt-spec, else ~/.cache/trt-spec; read at call time (tests move it)."""
    import os

    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trt-spec"


CACHE_DIR_ENV = "TRT_SPEC_CACHE_DIR"


ADMIN_KEYS_SUBDIR = "admin-keys"  # PORT.key, 0600, per served port; removed on stop
PLAIN_BACKENDS_SUBDIR = "backends"
# SIGTERM: requests in flight get this long to finish, then end with a clear error. 60 s: a 2k-token answer on a
# loaded replica.
DRAIN_TIMEOUT_S = 60.0
DRAIN_CUT_GRACE_S = 5.0  # for the cut requests' error lines to go out
DRAIN_POLL_S = 0.25  # in-flight count poll; drained = two zero reads in a row
EXIT_TIMEOUT_S = 10  # tritonserver --exit-timeout-secs (nothing is left by then)
PROTOCOLS = ("grpc", "http")
PROTOCOL = "grpc"
URL = f"{HOST}:{GRPC_PORT}"  # a server started with the defaults
PROGRESS_LINE_S = 10.0  # on a non-terminal stderr
LOADING_WAIT_S = 30.0  # without --wait: grace for a server that answers but is still loading
# After a phase unload (runtime llmapi), how long the next model's planned GPU memory may take to come free: the
# stub's LLM-API workers exit after Triton lists the model unloaded (seconds; a 70B TP2's NCCL teardown included).
GPU_MEMORY_WAIT_S = 120.0
GPU_MEMORY_POLL_S = 1.0
GPU_MEMORY_SLACK_GIB = 1.0  # tritonserver's own CUDA context and pool on the GPU, which the memory plan does not count

# -- Kubernetes bundle (trt-spec deploy k8s)
K8S_MOUNT_PATH = "/models"  # where the PersistentVolumeClaim is mounted
# startupProbe budget (60 min): a 70B FP8 engine is read from network storage, sha256-verified and loaded.
K8S_STARTUP_PERIOD_S, K8S_STARTUP_FAILURES = 10, 360
K8S_SHM_SIZE = "16Gi"  # /dev/shm: python-backend tensors of in-flight requests + NCCL buffers
# HPA custom metric name (upstream-facts: triton-autoscaling-queue-compute-metric)
QUEUE_COMPUTE_METRIC = "triton:queue_compute:ratio"
OPENAI_PORT = 9000  # the chart's OpenAI endpoint (upstream-facts: triton-openai-frontend-port)
# -- OpenAI frontend keys and limits (serve/openai/guard.py)
OPENAI_API_KEY_ENV = "TRT_SPEC_OPENAI_API_KEY"  # the key when no --api-key-file is given
# Request body cap, far below the JSON size that crashes Triton's HTTP server
# (upstream-facts: triton-http-large-json-crash).
OPENAI_MAX_BODY_BYTES = 2**20
OPENAI_MAX_MESSAGES = 1024  # checked before the chat template renders them
OPENAI_MAX_CONTENT_PARTS = 1024  # per message
# Admission: requests in Triton at once, then a FIFO queue; beyond both a 429. 256 exceeds one engine's batch.
OPENAI_MAX_CONCURRENT = 256
OPENAI_MAX_QUEUED = 256
OPENAI_RETRY_AFTER_S = 1  # a slot frees as soon as any generation ends
# A stream whose client takes longer than this to accept one chunk is abandoned and its Triton call cancelled.
OPENAI_SEND_TIMEOUT_S = 60.0
# On stop, open streams get this long, then a 503 in OpenAI's shape (a dead model's calls never end).
OPENAI_STOP_GRACE_S = 2.0
# uvicorn limit_concurrency: above max_concurrent + max_queued, so the frontend's own 429 answers first.
OPENAI_CONNECTION_LIMIT = 2048
OPENAI_KEEP_ALIVE_S = 5  # uvicorn's timeout_keep_alive default
VERIFY_COST_GPU = 1.0  # r: at small batch, verifying k+1 tokens costs ~one decode step (memory-bound)

# -- Reference engine: prefix cache
PREFIX_CACHE_BYTES = 512 * 2**20  # when the caller gives no budget
PREFIX_CACHE_TOKENS = 16384  # positions, when the config has no max_tokens_in_paged_kv_cache

# -- Reference engine: EAGLE-3 head training
EAGLE_DRAFT_VOCAB = 4096  # the commonest target tokens of the training data (d2t)
EAGLE_TRAIN_STEPS = 300

# -- Harness (check / bench / tune / demo)
PROMPT_SET = "code-edit"
TURNS = "first"  # a multi-turn question's first turn only
TUNE_KS = (1, 2, 4)
SAMPLING_SAMPLES = 200  # check --temperature: seeded samples per prompt and model
# check: tokens within the margin of the baseline's best are a near-tie, not a mismatch (GPU context-phase kernels
# differ from decode). The margin is NOISE_FLOOR_SAFETY x the noise floor check measures on the baseline engine; these
# two are the fallbacks when nothing could be measured. 0.25: an estimate of FP8 context-FMHA noise, not a measurement.
NEAR_TIE_MARGIN = 0.25
# The CPU stand-in is exact up to float32 summation order, so anything wider is a defect.
NEAR_TIE_MARGIN_EXACT = 1e-3
# The noise floor: at this many positions of the baseline engine's own output, |top-2 gap of its generation-phase
# logits - that of a teacher-forced context-phase probe|; each position is one probe, so it stays cheap.
NOISE_FLOOR_POSITIONS = 8
NOISE_FLOOR_TOKENS = 5  # tokens per prompt asked with their logits (positions 1.. are generation steps)
NOISE_FLOOR_SAFETY = 2.0  # the max of a few samples understates the noise's tail
CONTINUATION_TOKENS = 12  # an unverified divergence shows each side's text for this many tokens
# "MARGIN[,SEED]": the CPU stand-in perturbs context-phase logits by < MARGIN (decode exact), as a GPU flips near-ties.
GPU_NUMERICS_ENV = "TRT_SPEC_GPU_NUMERICS"

# -- Demo
DEMO_CONFIG = "build_configs/cpu-smollm2-ngram.yaml"
DEMO_OUT = f"{BUILD_ROOT}/demo"

# One HGX/DGX node; a wider plan is multi-node or refused (the Helm chart).
GPUS_PER_NODE = 8

DEFAULT_KV_FRACTION = 0.9  # the executor's default share of free GPU memory for the KV cache
