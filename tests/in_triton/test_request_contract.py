"""What the engine stand-in and the BLS accept and send, checked without a server: python models send exactly
the outputs a request names (the backend fills only requested token outputs, and Triton 2.51's python backend
would drop anything else with the GIL released, python_backend #390); malformed or out-of-range request values
get one line naming the problem, the backend's own where it has one."""

import numpy as np
import pytest

from trt_spec.in_triton.serving import error_line, requested_only
from trt_spec.in_triton.speculative_loop import RequestError, check_sampling
from trt_spec.records import backend_contract as bc

LIMITS = bc.EngineLimits(
    max_batch_size=4, max_seq_len=64, max_num_tokens=64, max_draft_len=4, vocab_size=100, gather_generation_logits=True
)


def _req(outputs=bc.MANDATORY_OUTPUTS, **extra):
    inputs = {
        "input_ids": np.asarray([[5, 6, 7]], dtype=np.int32),
        "request_output_len": np.asarray([[4]], dtype=np.int32),
        **extra,
    }
    return bc.parse_request(inputs, list(outputs), LIMITS, {}, decoupled=True)


def test_engine_response_holds_only_requested_outputs():
    perf = {"return_perf_metrics": np.asarray([[True]])}
    pm = bc.PerfOutputs(accepted=1, drafted=2)
    lean = bc.response_tensors(_req(bc.MANDATORY_OUTPUTS, **perf), [8, 9], perf=pm)
    assert set(lean) == set(bc.MANDATORY_OUTPUTS)  # perf outputs computed but not asked for: not sent
    full = bc.response_tensors(_req([*bc.MANDATORY_OUTPUTS, *bc.PERF_OUTPUTS], **perf), [8, 9], perf=pm)
    assert set(full) == set(bc.MANDATORY_OUTPUTS) | set(bc.PERF_OUTPUTS)
    assert float(full["acceptance_rate"][0, 0]) == 0.5
    assert full["output_ids"].tolist() == [[[5, 6, 7, 8, 9]]]
    # the ten perf outputs in the backend's dtypes and [1, 1] shape (NVIDIA's clients read them as x[0][0])
    assert {k: (v.dtype.name, v.shape) for k, v in full.items() if k in bc.PERF_OUTPUTS} == {
        k: ({"TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_FP32": "float32"}[t], (1, 1))
        for k, t in bc.PERF_OUTPUT_TYPES.items()
    }


def test_return_perf_metrics_writes_outputs_a_config_must_declare():
    """fillTritonResponse writes the ten perf outputs whether or not they were requested; Triton core refuses an
    undeclared one, and the whole response fails (what Medusa/EAGLE/lookahead requests through the BLS hit)."""
    perf = {"return_perf_metrics": np.asarray([[True]])}
    three = ["output_ids", "sequence_length", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"]
    with pytest.raises(
        bc.ContractError,
        match="Could not get response output for output tensor "
        "kv_cache_alloc_new_blocks: unexpected inference output 'kv_cache_alloc_new_blocks' for "
        "model 'tensorrt_llm'",
    ):
        bc.response_tensors(_req(bc.MANDATORY_OUTPUTS, **perf), [8], declared=three)
    # without the flag nothing beyond the token outputs is written, and the same config is fine
    assert set(bc.response_tensors(_req(bc.MANDATORY_OUTPUTS), [8], declared=three)) == set(bc.MANDATORY_OUTPUTS)
    declared = [t.name for t in bc.OUTPUTS]  # what trt-spec's engine configs declare
    assert set(bc.PERF_OUTPUTS) <= set(declared)
    bc.response_tensors(_req(bc.MANDATORY_OUTPUTS, **perf), [8], declared=declared)


def test_logits_cross_only_in_the_configs_logits_dtype():
    """use_draft_logits and return_generation_logits need the engine's logits dtype to be the config's (Triton core's
    input dtype check, the executor's buffer copy, the backend's TLLM_CHECK): an engine left with ModelOpt's float16
    logits behind trt-spec's TYPE_FP32 config fails such requests; plain requests still pass."""
    fp16 = bc.EngineLimits(
        max_batch_size=4,
        max_seq_len=64,
        max_num_tokens=64,
        max_draft_len=4,
        vocab_size=100,
        logits_dtype=bc.FP16_LOGITS,
        gather_generation_logits=True,
    )
    base = {"input_ids": np.asarray([[5, 6, 7]], dtype=np.int32), "request_output_len": _i32(4)}
    with_logits = [
        {"return_generation_logits": np.asarray([[True]])},
        {"draft_input_ids": _i32(8, 9), "draft_logits": np.zeros((1, 2, 100), np.float32)},
    ]
    for extra in with_logits:
        with pytest.raises(bc.ContractError, match="engine's logits are float16 but the model config declares float32"):
            bc.parse_request({**base, **extra}, bc.MANDATORY_OUTPUTS, fp16, {}, decoupled=True)
        bc.parse_request({**base, **extra}, bc.MANDATORY_OUTPUTS, LIMITS, {}, decoupled=True)  # float32: fine
    bc.parse_request(base, bc.MANDATORY_OUTPUTS, fp16, {}, decoupled=True)


def test_generation_logits_only_from_an_engine_built_to_gather_them():
    """Executor::Impl::fetchNewRequests: return_generation_logits on an engine built without
    --gather_generation_logits is refused (the backend never sets ExecutorConfig::gatherGenerationLogits), so
    `trt-spec check`'s probe needs the engine that serves the baseline built with the flag."""
    base = {
        "input_ids": np.asarray([[5, 6, 7]], dtype=np.int32),
        "request_output_len": _i32(1),
        "return_generation_logits": np.asarray([[True]]),
    }
    plain = bc.EngineLimits(max_batch_size=4, max_seq_len=64, max_num_tokens=64, vocab_size=100)
    with pytest.raises(
        bc.ContractError,
        match="Encountered an error when fetching new request: To return generation "
        "logits, gather_generation_logits must be enabled in ExecutorConfig",
    ):
        bc.parse_request(base, [*bc.MANDATORY_OUTPUTS, bc.GENERATION_LOGITS], plain, {}, decoupled=True)
    gathers = bc.EngineLimits(
        max_batch_size=4, max_seq_len=64, max_num_tokens=64, vocab_size=100, gather_generation_logits=True
    )
    req = bc.parse_request(base, [*bc.MANDATORY_OUTPUTS, bc.GENERATION_LOGITS], gathers, {}, decoupled=True)
    # the one-token probe's logits come back [1, beams, T, V] (fillTritonResponse), float32
    out = bc.response_tensors(req, [8], logits=np.zeros((1, 100), np.float32))
    assert out[bc.GENERATION_LOGITS].shape == (1, 1, 1, 100) and out[bc.GENERATION_LOGITS].dtype == np.float32
    bc.parse_request(
        {k: v for k, v in base.items() if k != "return_generation_logits"},
        bc.MANDATORY_OUTPUTS,
        plain,
        {},
        decoupled=True,
    )  # a plain request is fine


def test_an_output_len_past_max_seq_len_is_lowered_like_the_executor():
    """LlmRequest::validate: prompt + request_output_len + the engine's max_draft_len over max_seq_len lowers the
    output length (a warning), it is not an error."""
    r = _req(request_output_len=_i32(60))  # 3 + 60 + 4 > 64
    assert r.output_len == 64 - 3 - 4 and "Number of requested output tokens is changed to (57)" in r.warning
    assert _req(request_output_len=_i32(57)).warning is None


def test_the_kernel_temperature_rule_and_the_half_clamp():
    """penaltyKernels.cu: logits * 1/(T + 1e-6), clamped to +-65504 for half logits. Temperature 0 on FP16 logits
    ties every logit above ~0.066 at 65504, so argmax picks the lowest such id, not the best token; on FP32 logits
    the order survives."""
    import torch

    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    half = bc.kernel_logits(logits, 0.0, bc.FP16_LOGITS)
    assert half.tolist() == [65504.0, 65504.0, -65504.0, 65504.0] and int(half.argmax()) == 0
    assert int(bc.kernel_logits(logits, 0.0, bc.LOGITS_DTYPE).argmax()) == 1
    assert torch.equal(bc.kernel_logits(logits, None, bc.LOGITS_DTYPE), logits)  # no temperature: untouched
    assert torch.equal(bc.kernel_logits(logits, 1.0, bc.LOGITS_DTYPE), logits)  # T = 1: hasTemperature false
    assert torch.allclose(bc.kernel_logits(logits, 0.5, bc.LOGITS_DTYPE), logits / (0.5 + 1e-6))
    # with neither top_k nor top_p the engine takes the argmax (k = 1) at any temperature: of the kernel's logits
    assert _req(temperature=np.asarray([[0.0]], np.float32)).greedy
    assert not _req(temperature=np.asarray([[0.0]], np.float32), runtime_top_p=np.asarray([[0.9]], np.float32)).greedy


def test_requested_only_keeps_the_requested_tensors_unchanged():
    tensors = {
        "text_output": np.array([[b"hi"]], dtype=object),
        "output_ids": np.asarray([[1, 2]]),
        "acceptance_rate": np.asarray([[0.5]], dtype=np.float32),
    }
    kept = requested_only(tensors, ["text_output", "not_an_output"])
    assert list(kept) == ["text_output"] and kept["text_output"] is tensors["text_output"]
    assert requested_only(tensors, []) == {}


def _i32(*v):
    return np.asarray([list(v)], dtype=np.int32)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"input_lengths": _i32(7)}, r"input_lengths 7 does not match input_ids \(3 tokens\)"),
        ({"input_lengths": _i32(-1)}, "input_lengths -1 does not match input_ids"),
        ({"request_output_len": _i32(0)}, "request_output_len must be >= 1, got 0"),
        ({"input_ids": _i32(5, 100, 7)}, r"input_ids holds token id 100 outside the vocabulary \[0, 100\)"),
        ({"input_ids": _i32(-3)}, "input_ids holds token id -3"),
        ({"draft_input_ids": _i32(1, 250)}, "draft_input_ids holds token id 250"),
        ({"end_id": _i32(100)}, r"end_id 100 is outside \[-1, 100\)"),
        ({"temperature": np.asarray([[np.inf]], np.float32)}, "temperature must be a finite number >= 0, got inf"),
        ({"temperature": np.asarray([[np.nan]], np.float32)}, r"temperature.value\(\) >= 0"),
        ({"runtime_top_k": _i32(-2)}, r"topK.value\(\) >= 0"),
        ({"seed": np.asarray([[-1]], np.int64)}, r"seed -1 is outside 0..2\^64-1"),
        ({"stop_words_list": np.asarray([[[5, 6, 7]]], np.int32)}, "Sparse list must not have odd length"),
        ({"stop_words_list": np.asarray([[[5, 6], [3, -1]]], np.int32)}, "out-of-bound offsets"),
        ({"stop_words_list": np.asarray([[[5, 6, 7], [2, 1, -1]]], np.int32)}, "non-increasing offsets"),
        ({"stop_words_list": np.asarray([[[5, 6, 7], [1, -1, 3]]], np.int32)}, "additional -1s"),
    ],
)
def test_engine_refuses_inconsistent_inputs(extra, message):
    with pytest.raises(bc.ContractError, match=message):
        _req(**extra)


def test_well_formed_word_lists_parse():
    r = _req(stop_words_list=np.asarray([[[5, 6, 7, 0], [2, 3, -1, -1]]], np.int32))
    assert r.stop_words == [[5, 6], [7]]
    assert bc.word_list(bc.word_list_array([[1, 2], [3]])) == [[1, 2], [3]]


@pytest.mark.parametrize(
    "values,message",
    [
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_p": 1.5}, r"top_p must be in \[0, 1\], got 1.5"),
        ({"top_p": float("nan")}, "top_p must be in"),
        ({"seed": 2**64}, r"seed must be in 0..2\^64-1"),
        ({"end_id": 100}, r"end_id 100 is outside the vocabulary \[0, 100\)"),
        ({"pad_id": -2}, r"pad_id -2 is outside the vocabulary"),
    ],
)
def test_bls_sampling_values_are_checked_before_any_engine_call(values, message):
    args = {
        "temperature": None,
        "top_k": None,
        "top_p": None,
        "seed": None,
        "end_id": 2,
        "pad_id": 0,
        "vocab_size": 100,
        **values,
    }
    with pytest.raises(RequestError, match=message):
        check_sampling(**args)


def test_error_lines_carry_no_trace_or_path():
    logged = []
    assert (
        error_line("m", RequestError("max_tokens must be >= 1, got 0"), logged.append)
        == "max_tokens must be >= 1, got 0"
    )
    assert not logged
    try:
        open("/nonexistent/dir/file")
    except OSError as e:
        line = error_line("tensorrt_llm", e, logged.append)
    assert line == "tensorrt_llm: internal error (FileNotFoundError); the server log has the details"
    assert "Traceback" in logged[0] and "/nonexistent" in logged[0]  # the log keeps the detail


def test_max_queue_size_is_read_from_the_queue_policy_like_the_backend():
    """MIS getExecutorConfigFromParams: dynamic_batching.default_queue_policy.max_queue_size; unset or 0 =
    unbounded (executorImpl enqueueRequests checks `maxQueueSize > 0`)."""
    policy = lambda v: {"dynamic_batching": {"default_queue_policy": {"max_queue_size": v}}}  # noqa: E731
    assert bc.max_queue_size({}) is None
    assert bc.max_queue_size(policy("0")) is None
    assert bc.max_queue_size(policy("3")) == 3 and bc.max_queue_size(policy(3)) == 3
    assert bc.QUEUE_FULL.format(max=3) == "Maximum queue size of 3 has been reached, please try again later"


def test_the_standin_opens_gpt_model_path_as_the_backend_does(tmp_path, monkeypatch):
    """The tensorrtllm backend checks gpt_model_path with std::filesystem::exists on the raw string (model_instance_
    state.cc, ModelInstanceState ctor): a relative path resolves against tritonserver's working directory, never the
    repository, and a miss becomes "Both encoder and decoder model paths are empty". The stand-in does the same (its
    python models used to resolve it against the repository, so a launch from elsewhere passed on CPU and failed on a
    GPU), and adds a hint naming the path, the working directory and the fix."""
    pytest.importorskip("torch")
    from trt_spec.in_triton.serving import resolve_path_parameters
    from trt_spec.reference.standin import StandIn, check_engine_path

    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "engines" / "target").mkdir(parents=True)
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": "engines/target",
        "tokenizer_dir": "tok",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
    }
    cfg = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    resolved = resolve_path_parameters(cfg, str(repo / "tensorrt_llm"))["parameters"]
    assert resolved["gpt_model_path"]["string_value"] == "engines/target"  # as written: the backend's reading
    assert resolved["tokenizer_dir"]["string_value"] == str(repo / "tok")  # an old repository's tokenizer still loads
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(bc.ContractError) as e:
        StandIn.load(cfg, "tensorrt_llm")
    msg = str(e.value)
    assert msg.startswith(
        "unexpected error when creating modelInstanceState: Both encoder and decoder model paths are empty"
    )  # the backend's own text first
    assert (
        f"gpt_model_path 'engines/target' is not an engine directory from the server's working directory {elsewhere}"
        in msg
        and "trt-spec repo" in msg
        and "\n" not in msg
    )
    monkeypatch.chdir(repo)
    check_engine_path("engines/target")  # from the directory it resolves against, it is found
    check_engine_path(str(repo / "engines" / "target"))


def test_the_loop_reads_the_bls_parameters_block():
    """The BLS's parameters as Triton hands them (strings) -> the typed record, which is the loop's config."""
    from trt_spec.in_triton.speculative_loop import SpeculativeLoop
    from trt_spec.records.bls_parameters import BlsParameters, ParameterError

    block = {
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "",
        "speculative_mode": "ngram",
        "max_draft_len": "4",
        "num_draft_tokens": "3",
        "ngram_size": "2",
        "draft_len_policy": "fixed",
        "proposer": "prompt_lookup",
        "max_seq_len": "64",
        "max_num_tokens": "32",
        "max_input_len": "20",
        "tokenizer_dir": "/tok",
        "add_special_tokens": "false",
    }
    p = BlsParameters.from_parameters(block)
    cfg = SpeculativeLoop(p, call=None).cfg
    assert cfg is p
    assert (cfg.tensorrt_llm_model_name, cfg.draft, cfg.speculative_mode, cfg.max_draft_len, cfg.ngram_size) == (
        "tensorrt_llm",
        None,
        "ngram",
        4,
        2,
    )
    assert (cfg.max_input_len, cfg.engine_input_limit) == (20, bc.max_input_len(64, 32))
    assert (cfg.draft_len_policy, cfg.proposer, p.num_draft_tokens, p.add_special_tokens) == (
        "fixed",
        "prompt_lookup",
        3,
        False,
    )
    with pytest.raises(ParameterError, match="^tensorrt_llm_bls parameter ngram_size: expected an integer, got '2.5'$"):
        BlsParameters.from_parameters({**block, "ngram_size": "2.5"})
