"""Defaults used in more than one place, one definition each: the functions take them as keyword defaults and the
CLI's options show them (`default=defaults.X`), so `--help` and the code cannot drift apart.

Standard library only: the CLI imports this module at startup.
"""

from __future__ import annotations

from pathlib import Path

# -- Build ---------------------------------------------------------------------------------------------------
BUILD_ROOT = "build"  # a config without output_dir builds into BUILD_ROOT/NAME
TOKENS_PER_BLOCK = 32  # KV-cache block size (trtllm-build --tokens_per_block): small blocks reuse more prefix
REPO_SUBDIR = "model_repo"  # the Triton model repository inside a build dir (trt-spec repo) or a demo dir


def served_num_draft_tokens(default_k: int, max_draft_len: int) -> int:
    """The deployment's k per request when a request names none: speculative.num_draft_tokens (else
    max_draft_len), never more than the max_draft_len the engine is built with."""
    return min(default_k, max_draft_len)


# -- The served python models ------------------------------------------------------------------------------
ADD_SPECIAL_TOKENS = True  # preprocessing and the BLS tokenize prompts with the tokenizer's special tokens (BOS)
# The suffix proposer's cross-request cache (speculative.suffix_cache; in_triton/suffix.py SuffixCache). Per store
# (one per tenant, or one per deployment): the last SUFFIX_CACHE_MAX_SEQUENCES finished requests, at most
# SUFFIX_CACHE_MAX_TOKENS tokens (~130 bytes each, index included); at most SUFFIX_CACHE_MAX_TENANTS tenant stores.
# Worst case 32 x 16384 tokens, ~70 MB per BLS instance.
SUFFIX_CACHE_SCOPE = "tenant"  # records.speculation.CacheScope: a request without a tenant neither reads nor writes it
SUFFIX_CACHE_MAX_TOKENS = 16384
SUFFIX_CACHE_MAX_SEQUENCES = 64
SUFFIX_CACHE_MAX_TENANTS = 32
TENANT_MAX_BYTES = 256  # the longest tenant id a request may send (the BLS's tenant input, OpenAI's user)

# -- Serving (trt-spec serve) and the clients that reach it -------------------------------------------------
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002  # tritonserver's own defaults
HOST = "127.0.0.1"  # bind to loopback: nothing is open to the network unless asked
READY_TIMEOUT_S = 180.0  # the longest wait for every model to load: this much, plus READY_S_PER_ENGINE_GIB per GiB
READY_S_PER_ENGINE_GIB = 6.0  # of engine files (~170 MB/s: a cold 70B FP8 TP2 load from network storage, ~10 min)


# runtime llmapi on a GPU: after the weights, the LLM API captures CUDA graphs for every padded batch size and autotunes
# its kernels before the model reports READY (minutes for a 70B model; not measured here)
LLMAPI_READY_EXTRA_S = 300.0


def ready_timeout_s(engine_bytes: int = 0) -> float:
    """How long `trt-spec serve` waits for every model to load: READY_TIMEOUT_S plus READY_S_PER_ENGINE_GIB per GiB of
    the repository's engine files (serve.launch.engine_bytes)."""
    return READY_TIMEOUT_S + READY_S_PER_ENGINE_GIB * engine_bytes / 2**30


def cache_dir() -> Path:
    """trt-spec's per-user cache ($TRT_SPEC_CACHE_DIR, else $XDG_CACHE_HOME/trt-spec, else ~/.cache/trt-spec):
    ADMIN_KEYS_SUBDIR (the key of each `trt-spec serve` on this host, by port) and PLAIN_BACKENDS_SUBDIR (the backend
    directory the printed plain command names on nvidia-pytriton). Read at call time (tests point it elsewhere)."""
    import os

    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trt-spec"


CACHE_DIR_ENV = "TRT_SPEC_CACHE_DIR"


ADMIN_KEYS_SUBDIR = (
    "admin-keys"  # PORT.key: written 0600 by `trt-spec serve` for its HTTP and gRPC ports, removed on stop
)
PLAIN_BACKENDS_SUBDIR = "backends"
# SIGTERM: serve stops admitting and lets requests in flight finish for at most this long, then ends the rest with a
# clear error and stops. 60 s: a 2k-token answer at the slow end of a loaded replica.
DRAIN_TIMEOUT_S = 60.0
DRAIN_CUT_GRACE_S = 5.0  # after the drain timeout: this long for the cut requests' error lines to go out
DRAIN_POLL_S = 0.25  # how often the drain reads the server's in-flight count (done = two zero reads in a row)
EXIT_TIMEOUT_S = 10  # tritonserver --exit-timeout-secs: its own wait once serve stops it (nothing is left by then)
PROTOCOLS = ("grpc", "http")  # what the harness client speaks
PROTOCOL = "grpc"  # check / bench / tune
URL = f"{HOST}:{GRPC_PORT}"  # check / bench / tune --url: a server started with the defaults, over PROTOCOL
PROGRESS_LINE_S = 10.0  # check / bench / tune on a non-terminal stderr: a progress line at most this often
LOADING_WAIT_S = 30.0  # check / bench / tune without --wait: how long a server that answers but is still loading gets

# -- Kubernetes bundle (trt-spec deploy k8s) ---------------------------------------------------------------
K8S_MOUNT_PATH = "/models"  # where the PersistentVolumeClaim (checkpoints, builds, repositories) is mounted
# startupProbe budget: a 70B FP8 engine (~70 GB) is read from the claim, sha256-verified by `trt-spec serve` and
# loaded; on network storage at ~200 MB/s that alone is ~6 min per pass. 60 min covers it with room.
K8S_STARTUP_PERIOD_S, K8S_STARTUP_FAILURES = 10, 360
K8S_SHM_SIZE = "16Gi"  # memory-backed /dev/shm: python-backend tensors of every in-flight request + NCCL buffers
# The HPA's custom metric, spelled as NVIDIA's Triton autoscaling tutorial spells it (tutorials, Deployment/Kubernetes/
# TensorRT-LLM_Autoscaling_and_Load_Balancing: a PrometheusRule records it, prometheus-adapter serves it by that name).
QUEUE_COMPUTE_METRIC = "triton:queue_compute:ratio"
OPENAI_PORT = 9000  # the chart's OpenAI endpoint (trt-spec serve --openai-port; Triton's own frontend's default too)
# -- The OpenAI frontend's keys and limits (serve/openai/guard.py; each limit a frontend flag and a `serve` option) --
OPENAI_API_KEY_ENV = "TRT_SPEC_OPENAI_API_KEY"  # the key when no --api-key-file is given (as vLLM's VLLM_API_KEY)
# Request body cap, checked on Content-Length before reading and again while reading (chunked bodies): well below
# the ~4 MiB JSON body on which Triton 2.51's HTTP server crashes (docs/reliability.md); a prompt the deployment can
# take is far smaller (the frontend refuses one over max_input_len tokens anyway).
OPENAI_MAX_BODY_BYTES = 2**20
OPENAI_MAX_MESSAGES = 1024  # chat `messages` per request (checked before the chat template renders them)
OPENAI_MAX_CONTENT_PARTS = 1024  # content parts in one message
# Admission: requests working in Triton at once, and requests waiting (in order) for one of those slots; beyond
# both, a 429 with Retry-After. 256 in flight is above what one engine batches (max_batch_size) and below what the
# frontend's memory minds; the queue bounds the rest.
OPENAI_MAX_CONCURRENT = 256
OPENAI_MAX_QUEUED = 256
OPENAI_RETRY_AFTER_S = 1  # the 429's Retry-After (seconds): a slot frees as soon as any one generation ends
# A streamed response whose client takes longer than this to accept one chunk is abandoned (its connection closed,
# its Triton call cancelled if still running): a reader that stopped reading holds nothing for long.
OPENAI_SEND_TIMEOUT_S = 60.0
# The frontend stopping (SIGTERM: serve stops it after Triton drained, or after a fault): the streams and calls still
# open get this long to end on their own (after a drain they only have their last bytes to send), then each ends with
# a 503 "server shutting down" error in OpenAI's shape, not a dropped connection (a dead model's calls never end).
OPENAI_STOP_GRACE_S = 2.0
# uvicorn's limit_concurrency (connections and tasks; beyond it a bare 503): above max_concurrent + max_queued so the
# frontend's own OpenAI-shaped 429 answers first; the frontend raises it to 2 x (their sum) if they are larger.
OPENAI_CONNECTION_LIMIT = 2048
# uvicorn's timeout_keep_alive (its own default, said here): an idle keep-alive connection is closed after this.
OPENAI_KEEP_ALIVE_S = 5
VERIFY_COST_GPU = 1.0  # r: a GPU at small batch verifies k+1 tokens in about one decode step (memory-bound)

# -- Reference engine: the prefix cache (KV of earlier requests, reused by a request sharing their prefix) ----
PREFIX_CACHE_BYTES = 512 * 2**20  # ReferenceEngine's budget when its caller gives none (in-process use)
# The served engine's budget, in positions, when its config has no max_tokens_in_paged_kv_cache (where the GPU
# backend would take 0.9 of free memory).
PREFIX_CACHE_TOKENS = 16384

# -- Reference engine: EAGLE-3 head training (speculative.eagle.train, trt_spec/reference/train_eagle.py) ----------
EAGLE_DRAFT_VOCAB = 4096  # draft vocabulary: the commonest target tokens of the training data (EAGLE-3's d2t)
EAGLE_TRAIN_STEPS = 300  # optimizer steps (4 rows of 192 positions x 3 unrolled drafting steps each)

# -- Harness (check / bench / tune / demo) -------------------------------------------------------------------
PROMPT_SET = "code-edit"
TURNS = "first"  # bench --turns: a multi-turn question's first turn only (harness/prompts.TURNS)
TUNE_KS = (1, 2, 4)  # tune's k sweep
SAMPLING_SAMPLES = 200  # check --temperature: seeded samples per prompt and model
# check: a divergence whose two tokens lie within this many logits of the baseline engine's best (its top-2 margin,
# read at the divergence from the engine that serves the baseline) is a numerical near-tie, not a mismatch: on a GPU
# the speculative path computes those positions in the context phase (FP8 context FMHA, other GEMM shapes) while the
# baseline decodes them one at a time, and two tokens this close swap under any kernel change. 0.25 is an estimate,
# not a measurement: FP8 context FMHA quantizes Q/K/V and the softmax P to e4m3 (3 mantissa bits, ~6% relative step),
# and batch-shape changes alone move a 70B model's BF16 logits by ~0.01-0.1; a broken accept rule takes tokens whole
# logits below the best. The first GPU run (make gpu-smoke, trt-spec check) prints every divergence's margin: replace
# the estimate with what it measures.
NEAR_TIE_MARGIN = 0.25
# ... and for the CPU stand-in (an engine model on Triton's python backend): its numerics are exact up to float32
# summation order (~1e-6 relative), so anything wider is a defect, not a near-tie. check picks by the probed engine's
# backend (Triton model metadata "platform"); --near-tie-margin overrides both.
NEAR_TIE_MARGIN_EXACT = 1e-3
# The CPU stand-in's GPU-numerics mode (trt_spec/reference/numerics.py): "MARGIN[,SEED]" in the environment of the
# process that loads the engine models perturbs every verification forward by less than MARGIN logits (seeded), so the
# speculative path flips near-ties the way a GPU's does. Unset: exact greedy semantics.
GPU_NUMERICS_ENV = "TRT_SPEC_GPU_NUMERICS"

# -- Demo (trt-spec demo, make demo) -------------------------------------------------------------------------
DEMO_CONFIG = "build_configs/cpu-smollm2-ngram.yaml"
DEMO_OUT = f"{BUILD_ROOT}/demo"

# GPUs per node when a deployment bundle is not told (`deploy trtllm-serve|dynamo|k8s --gpus-per-node`): the 8 of an
# HGX/DGX H100/H200/B200 node, the node Dynamo's and TensorRT-LLM's multi-node examples use. A plan wider than that is
# a multi-node layout (trtllm-serve under srun/mpirun, Dynamo's multinode.nodeCount) or refused (the Helm chart).
GPUS_PER_NODE = 8
