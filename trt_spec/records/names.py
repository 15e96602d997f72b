"""The names a trt-spec deployment answers to: its Triton models, their text tensors, files and metrics.

Clients break if one changes; the engine's own tensors are in backend_contract.py.
"""

from __future__ import annotations

from . import backend_contract as bc

# -- Triton models (NVIDIA's names, so its clients work unchanged; upstream-facts: names-nvidia-text-models)
PREPROCESSING = "preprocessing"  # text -> token ids
POSTPROCESSING = "postprocessing"  # token ids -> text
TARGET = "tensorrt_llm"  # the target engine
DRAFT = "tensorrt_llm_draft"  # the draft engine (draft-target mode only)
BASELINE_ENGINE = "tensorrt_llm_baseline"  # in-engine modes: the target without speculation, for the ensemble
ENGINE_MODELS = (TARGET, DRAFT, BASELINE_ENGINE)
ENSEMBLE = "ensemble"  # preprocessing -> tensorrt_llm -> postprocessing
BLS = "tensorrt_llm_bls"  # draft -> verify with draft_input_ids, streaming
# What the harness compares (text in, text out).
BASELINE, SPECULATIVE = ENSEMBLE, BLS
TEXT_MODELS = (BASELINE, SPECULATIVE)

# -- Tensors of the text models
TEXT_INPUT = "text_input"
MAX_TOKENS = "max_tokens"
NUM_DRAFT_TOKENS = "num_draft_tokens"  # BLS only: k (the adaptive policy's cap)
DRAFT_LEN_POLICY = "draft_len_policy"  # BLS only: adaptive | fixed
TENANT = "tenant"  # BLS only: the suffix cache's scope (OpenAI's `user`)
TEXT_OUTPUT = "text_output"
EMBEDDING_BIAS = ("embedding_bias_words", "embedding_bias_weights")  # declared for NVIDIA's clients; must be empty
BAD_WORDS, STOP_WORDS = "bad_words", "stop_words"  # strings; the engine gets word lists
TOP_K, TOP_P = "top_k", "top_p"
STREAM = "stream"
BEAM_WIDTH, NUM_RETURN_SEQUENCES = "beam_width", "num_return_sequences"  # NVIDIA's clients send them; 1 is served
USE_DRAFT_LOGITS = "use_draft_logits"  # BLS only: rejection sampling against the draft's logits
RETURN_PROFILE = "return_profile"  # BLS only: add the request's time profile (PROFILE) to its final response
# Other inputs share the engine's names (bc.END_ID, bc.TEMPERATURE, ...).
OUTPUT_IDS, SEQUENCE_LENGTH = bc.MANDATORY_OUTPUTS


class Pre:
    """preprocessing's tensors (NVIDIA's names; upstream-facts: names-nvidia-text-models)."""

    QUERY, REQUEST_OUTPUT_LEN, END_ID, PAD_ID = "QUERY", "REQUEST_OUTPUT_LEN", "END_ID", "PAD_ID"
    BAD_WORDS, STOP_WORDS = "BAD_WORDS_DICT", "STOP_WORDS_DICT"
    EMBEDDING_BIAS = ("EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS")
    INPUT_ID, DECODER_INPUT_ID, REQUEST_INPUT_LEN = "INPUT_ID", "DECODER_INPUT_ID", "REQUEST_INPUT_LEN"
    BAD_WORDS_IDS, STOP_WORDS_IDS, OUT_END_ID, OUT_PAD_ID = (
        "BAD_WORDS_IDS",
        "STOP_WORDS_IDS",
        "OUT_END_ID",
        "OUT_PAD_ID",
    )


class Post:
    """postprocessing's tensors (NVIDIA's names, and trt-spec's OUTPUT_IDS)."""

    TOKENS_BATCH, SEQUENCE_LENGTH = "TOKENS_BATCH", "SEQUENCE_LENGTH"
    OUTPUT = "OUTPUT"  # one string per sequence and beam
    OUTPUT_IDS = "OUTPUT_IDS"  # cut to SEQUENCE_LENGTH: the ensemble's output_ids


POST_OUTPUT_IDS = Post.OUTPUT_IDS
# The BLS's whole-request metrics: the engine's perf outputs plus these.
TOTAL_STEPS = "total_steps"
# [j] = steps that drafted and accepted exactly j drafts; empty when the engine's steps cannot be seen (not decoupled).
ACCEPTED_LENGTH_HISTOGRAM = "accepted_length_histogram"
DRAFT_LENGTHS = "draft_lengths"  # k chosen per round; 0 = no speculation
# accepted draft tokens of rounds whose proposal drew on the cross-request suffix cache (0 without one)
CACHE_ACCEPTED_TOKENS = "cache_accepted_tokens"
LIST_METRICS = (ACCEPTED_LENGTH_HISTOGRAM, DRAFT_LENGTHS)  # metric outputs that are lists, not one number
# JSON of records/profile.RequestProfile: where the request's time went; only when the request sets RETURN_PROFILE
PROFILE = "profile"
METRIC_OUTPUTS = (*bc.SPEC_PERF_OUTPUTS, TOTAL_STEPS, CACHE_ACCEPTED_TOKENS, *LIST_METRICS, PROFILE)

# -- Files
# A relative tokenizer_dir resolves against the repository; gpt_model_path, like the backend's, against the cwd.
PATH_PARAMETERS = ("tokenizer_dir",)
TOKENIZER_FILES = (  # copied next to every engine that serves with them
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)

# -- Prometheus metrics the BLS publishes; labels model, mode (draft_target | ngram | engine)
METRIC_REQUESTS = "trt_spec_requests_total"  # counter: finished requests
METRIC_DRAFT_TOKENS = "trt_spec_draft_tokens_total"  # counter: drafted tokens
METRIC_ACCEPTED_TOKENS = "trt_spec_accepted_draft_tokens_total"  # counter: accepted draft tokens
METRIC_ROUNDS = "trt_spec_rounds_total"  # counter: target calls of the speculative loop
METRIC_ROUNDS_NO_SPEC = "trt_spec_rounds_without_speculation_total"  # counter: rounds whose chosen k was 0
METRIC_ACCEPTED_LENGTH = "trt_spec_accepted_length"  # histogram: accepted draft tokens per round
METRIC_DRAFT_LENGTH = "trt_spec_draft_length"  # histogram: the draft length k chosen per round
METRIC_DRAFT_LATENCY = "trt_spec_draft_latency_seconds"  # histogram: seconds proposing, per round
METRIC_VERIFY_LATENCY = "trt_spec_verify_latency_seconds"  # histogram: seconds of the target call, per round
METRIC_IN_FLIGHT = "trt_spec_requests_in_flight"  # gauge: requests held now (serve's drain)
# Suffix cache: rounds drawing on earlier requests, their accepted drafts, and the tokens it holds
METRIC_CACHE_ROUNDS = "trt_spec_suffix_cache_rounds_total"  # counter
METRIC_CACHE_ACCEPTED = "trt_spec_suffix_cache_accepted_tokens_total"  # counter
METRIC_CACHE_TOKENS = "trt_spec_suffix_cache_tokens"  # gauge
# The same counts under vLLM's names and labels, so vLLM dashboards read trt-spec; a vLLM "draft" is a round here
# (upstream-facts: vllm-spec-decode-metrics).
VLLM_LABELS = ("model_name", "engine")
VLLM_NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_NUM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position
# The OpenAI frontend's client-side latency, per model, in vLLM's names (upstream-facts: vllm-frontend-metrics).
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram
VLLM_ITL = "vllm:inter_token_latency_seconds"  # histogram: a chunk of n tokens gives n gaps of its time / n
VLLM_E2E = "vllm:e2e_request_latency_seconds"  # histogram
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"  # counter
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"  # counter
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"  # counter
VLLM_RUNNING = "vllm:num_requests_running"  # gauge

# -- Host names that mean this machine (a server there can be inspected through /proc and NVML)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", "")
