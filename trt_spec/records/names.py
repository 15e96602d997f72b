"""The names a trt-spec deployment answers to: its Triton models and the tensors of their text interface.

A client written against these names (the harness, NVIDIA's end_to_end clients) breaks if one changes, so each is
written once, here, and read by the repository writer, the python models, the harness and the CLI. The
`tensorrt_llm` engine's own tensors (input_ids, draft_input_ids, output_ids, the perf outputs, ...) are the
backend's contract and live in trt_spec/records/backend_contract.py; the text models reuse some of them by name.
"""

from __future__ import annotations

from . import backend_contract as bc

# -- Triton models (NVIDIA's names, so clients written for tensorrtllm_backend work unchanged) ----------------
PREPROCESSING = "preprocessing"  # text -> token ids
POSTPROCESSING = "postprocessing"  # token ids -> text
TARGET = "tensorrt_llm"  # the target engine
DRAFT = "tensorrt_llm_draft"  # the draft engine (draft-target mode only)
BASELINE_ENGINE = "tensorrt_llm_baseline"  # Medusa/EAGLE/lookahead: the target without speculation, for the ensemble
ENGINE_MODELS = (TARGET, DRAFT, BASELINE_ENGINE)  # the models behind the tensorrtllm backend's contract
ENSEMBLE = "ensemble"  # preprocessing -> tensorrt_llm -> postprocessing
BLS = "tensorrt_llm_bls"  # draft -> verify with draft_input_ids, streaming
# What the harness compares: the non-speculative baseline and the speculative model (text in, text out).
BASELINE, SPECULATIVE = ENSEMBLE, BLS
TEXT_MODELS = (BASELINE, SPECULATIVE)

# -- Tensors of the text models (ensemble and tensorrt_llm_bls) --------------------------------------------
TEXT_INPUT = "text_input"
MAX_TOKENS = "max_tokens"
NUM_DRAFT_TOKENS = "num_draft_tokens"  # BLS only: k for this request (the cap, with the adaptive policy)
DRAFT_LEN_POLICY = "draft_len_policy"  # BLS only: adaptive | fixed for this request
TENANT = "tenant"  # BLS only: the client the request is from (the suffix cache's scope; OpenAI's `user`)
TEXT_OUTPUT = "text_output"
EMBEDDING_BIAS = ("embedding_bias_words", "embedding_bias_weights")  # declared for NVIDIA's clients; must be empty
BAD_WORDS, STOP_WORDS = "bad_words", "stop_words"  # strings; the engine gets them as word lists
TOP_K, TOP_P = "top_k", "top_p"  # the engine's runtime_top_k / runtime_top_p
STREAM = "stream"  # the engine's streaming
BEAM_WIDTH, NUM_RETURN_SEQUENCES = "beam_width", "num_return_sequences"  # NVIDIA's clients send them; 1 is served
USE_DRAFT_LOGITS = "use_draft_logits"  # BLS only: rejection sampling against the draft's logits
# The text models' inputs named as the engine's (bc.END_ID, bc.PAD_ID, bc.TEMPERATURE, bc.SEED,
# bc.EXCLUDE_INPUT_IN_OUTPUT, bc.RETURN_PERF_METRICS) are those constants.
OUTPUT_IDS, SEQUENCE_LENGTH = bc.MANDATORY_OUTPUTS  # the engine's outputs (the text models return output_ids)


class Pre:
    """preprocessing's tensors (NVIDIA's all_models/inflight_batcher_llm/preprocessing names)."""

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
    OUTPUT_IDS = "OUTPUT_IDS"  # the token ids cut to SEQUENCE_LENGTH: the ensemble's output_ids


POST_OUTPUT_IDS = Post.OUTPUT_IDS
# The BLS's whole-request metrics: the engine's perf outputs plus its own steps and accepted-length histogram.
TOTAL_STEPS = "total_steps"
# [j] = the request's speculative steps that accepted exactly j drafts, steps without drafts not counted (vLLM's
# acceptance_histogram). Loop modes: the rounds that drafted, j in 0..k (the request's num_draft_tokens). In-engine
# modes (Medusa, EAGLE, lookahead): the engine's verify steps, j in 0..max_draft_len, read from its streamed responses
# (in_triton/speculative_loop.py engine_step_histogram); empty where those do not show one step each (a non-decoupled
# deployment, whose engine call cannot stream), never a guess.
ACCEPTED_LENGTH_HISTOGRAM = "accepted_length_histogram"
DRAFT_LENGTHS = "draft_lengths"  # the draft length k the policy chose per round; 0 = a round without speculation
LIST_METRICS = (ACCEPTED_LENGTH_HISTOGRAM, DRAFT_LENGTHS)  # metric outputs that are lists, not one number
METRIC_OUTPUTS = (*bc.SPEC_PERF_OUTPUTS, TOTAL_STEPS, *LIST_METRICS)

# -- Files ------------------------------------------------------------------------------------------------
# A tokenizer's files, copied next to every engine (and distilled draft) that serves with it.
# Model-config parameters that name a directory are absolute (repository/writer.py ABSOLUTE_PATHS). The python models
# still resolve a relative tokenizer_dir (a repository written by trt-spec before that) against the repository
# (in_triton/serving.py repo_path); gpt_model_path is never resolved so: the tensorrtllm backend, and so the stand-in,
# resolves it against the server's working directory.
PATH_PARAMETERS = ("tokenizer_dir",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)

# -- Prometheus metrics the BLS publishes (Triton's metrics port, /metrics) ---------------------------------
# A Kubernetes alert rule and autoscaler read these names; labels: model (the BLS as served), mode (the loop's
# mode: draft_target | ngram | engine). trt_spec/in_triton/spec_metrics.py publishes and reads them.
METRIC_REQUESTS = "trt_spec_requests_total"  # counter: finished requests
METRIC_DRAFT_TOKENS = "trt_spec_draft_tokens_total"  # counter: drafted tokens
METRIC_ACCEPTED_TOKENS = "trt_spec_accepted_draft_tokens_total"  # counter: accepted draft tokens
METRIC_ROUNDS = "trt_spec_rounds_total"  # counter: target calls of the speculative loop
METRIC_ROUNDS_NO_SPEC = "trt_spec_rounds_without_speculation_total"  # counter: rounds whose chosen k was 0
METRIC_ACCEPTED_LENGTH = "trt_spec_accepted_length"  # histogram: accepted draft tokens per round
METRIC_DRAFT_LENGTH = "trt_spec_draft_length"  # histogram: the draft length k chosen per round
METRIC_DRAFT_LATENCY = "trt_spec_draft_latency_seconds"  # histogram: seconds proposing, per round
METRIC_VERIFY_LATENCY = "trt_spec_verify_latency_seconds"  # histogram: seconds of the target call, per round
METRIC_IN_FLIGHT = "trt_spec_requests_in_flight"  # gauge: requests the speculative model holds now (serve's drain)
# n-gram mode with the suffix cache on (speculative.suffix_cache): rounds whose proposal drew on earlier requests,
# the draft tokens those rounds got accepted, and the tokens the cache holds (all its stores) after the last request
METRIC_CACHE_ROUNDS = "trt_spec_suffix_cache_rounds_total"  # counter
METRIC_CACHE_ACCEPTED = "trt_spec_suffix_cache_accepted_tokens_total"  # counter
METRIC_CACHE_TOKENS = "trt_spec_suffix_cache_tokens"  # gauge
# The same counts under vLLM's names and labels (vllm/v1/spec_decode/metrics.py, SpecDecodingProm: Counters
# labelled model_name and engine, exposed with prometheus_client's _total suffix; the per-position one adds
# `position`, 0..k-1), which llama.cpp and trtllm-serve adopted: a dashboard written for vLLM reads trt-spec.
# A draft (vLLM) is a speculative round here: mean acceptance length = 1 + accepted / drafts.
VLLM_LABELS = ("model_name", "engine")
VLLM_NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_NUM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position: rounds accepting it
# The OpenAI frontend's own (its /metrics), in vLLM's names and labels (vllm/v1/metrics/loggers.py): latency as the
# client sees it, per model (ensemble = baseline, tensorrt_llm_bls = speculative).
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram
VLLM_ITL = "vllm:inter_token_latency_seconds"  # histogram: per token (a chunk of n tokens: n gaps of its time / n)
VLLM_E2E = "vllm:e2e_request_latency_seconds"  # histogram
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"  # counter
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"  # counter
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"  # counter
VLLM_RUNNING = "vllm:num_requests_running"  # gauge
