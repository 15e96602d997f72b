"""The CPU stand-in served by a real tritonserver enforces the tensorrtllm backend's contract
(trt_spec/records/backend_contract.py): it refuses what the backend refuses, with the backend's text, samples like
TensorRT-LLM, and serves NVIDIA's client request shapes (streaming ensemble client, unary draft-target client)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trt_spec.harness.client import ClientError, LLMClient
from trt_spec.records import backend_contract as bc
from trt_spec.serve.errors import ServerError
from trt_spec.serve.server import TritonServer, free_port

from ..farm import DEPLOYMENTS, LIMITS, tokenizer_dir
from ..requests import _tensor

PROMPT = "def add(a, b):\n    return"
K = DEPLOYMENTS["dtm"].k  # dtm_server's max_draft_len
GREEDY = {"exclude_input_in_output": True}


def engine_request(ids, out_len, **extra):
    ins = [
        _tensor("input_ids", [ids], np.int32),
        _tensor("input_lengths", [[len(ids)]], np.int32),
        _tensor("request_output_len", [[out_len]], np.int32),
    ]
    for k, (v, dt) in extra.items():
        ins.append(_tensor(k, v, dt))
    return ins


def stream_call(url, model, inputs, outputs):
    """One request over the gRPC stream API (how decoupled models are called); (responses, errors)."""
    import queue

    q, got, errs = queue.Queue(), [], []
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    c.async_stream_infer(
        model,
        inputs,
        outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] or None,
        enable_empty_final_response=True,
    )
    while True:
        r, e = q.get(timeout=60)
        if e is not None:
            errs.append(str(e))
            break
        got.append({o.name: r.as_numpy(o.name) for o in r.get_response().outputs})
        if r.get_response().parameters.get("triton_final_response").bool_param:
            break
    c.stop_stream()
    c.close()
    return got, errs


def prompt_ids(server):
    from trt_spec.in_triton.serving import encode, load_tokenizer

    tok = load_tokenizer(tokenizer_dir(server.repo))
    return encode(tok, PROMPT)


def test_engine_refuses_a_request_without_the_mandatory_outputs(dtm_server):
    ids = prompt_ids(dtm_server)
    _, errs = stream_call(dtm_server.grpc_url, "tensorrt_llm", engine_request(ids, 4), ["output_ids"])
    assert errs and "sequence_length tensor must be present in list of output tensors" in errs[0]
    got, errs = stream_call(dtm_server.grpc_url, "tensorrt_llm", engine_request(ids, 4), list(bc.MANDATORY_OUTPUTS))
    assert not errs
    out = next(g for g in got if "output_ids" in g)
    # non-streaming: [1, 1, prompt + 4], sequence_length [1, 1] (the backend's shapes)
    assert out["output_ids"].shape == (1, 1, len(ids) + 4) and out["sequence_length"].tolist() == [[len(ids) + 4]]


def test_engine_refuses_more_draft_tokens_than_it_was_built_for(dtm_server):
    ids = prompt_ids(dtm_server)
    ins = engine_request(ids, K + 2, draft_input_ids=([list(range(5, 5 + K + 1))], np.int32))
    _, errs = stream_call(dtm_server.grpc_url, "tensorrt_llm", ins, list(bc.MANDATORY_OUTPUTS))
    assert errs and f"Draft tokens length ({K + 1}) exceeds maximum draft tokens length ({K})." in errs[0]
    _, errs = stream_call(
        dtm_server.grpc_url,
        "tensorrt_llm",
        engine_request(ids, 4, beam_width=([[2]], np.int32)),
        list(bc.MANDATORY_OUTPUTS),
    )
    assert errs and "beamWidth (2) exceeds max_beam_width (1)" in errs[0]


def test_sampling_without_top_k_or_top_p_is_greedy_like_tensorrt_llm(dtm_server):
    c = LLMClient(dtm_server.grpc_url, "grpc")
    greedy = c.generate("ensemble", PROMPT, 12, **GREEDY).output_ids
    for seed in range(3):  # temperature 1 alone: TensorRT-LLM sets k = 1 -> greedy, on the ensemble and the BLS
        assert (
            c.generate("ensemble", PROMPT, 12, exclude_input_in_output=True, temperature=1.0, seed=seed).output_ids
            == greedy
        )
        assert (
            c.generate(
                "tensorrt_llm_bls", PROMPT, 12, exclude_input_in_output=True, temperature=1.0, seed=seed
            ).output_ids
            == greedy
        )
    sampled = {
        tuple(
            c.generate(
                "ensemble", PROMPT, 12, exclude_input_in_output=True, temperature=1.0, top_p=1.0, seed=seed
            ).output_ids
        )
        for seed in range(4)
    }
    assert sampled != {tuple(greedy)}  # top_p = 1.0 asks for sampling from the full distribution


def _e2e_client_inputs(beam_width=1):
    """What inflight_batcher_llm/client/end_to_end_grpc_client.py sends: the stream API, text_input, max_tokens,
    stream, beam_width, temperature and exclude_input_in_output always; no top_k/top_p; it requests text_output."""
    return [
        _tensor("text_input", [[PROMPT.encode()]], object),
        _tensor("max_tokens", [[12]], np.int32),
        _tensor("stream", [[False]], bool),
        _tensor("beam_width", [[beam_width]], np.int32),
        _tensor("temperature", [[1.0]], np.float32),
        _tensor("exclude_input_in_output", [[True]], bool),
        _tensor("num_return_sequences", [[1]], np.int32),
    ]


def _text(got):
    return "".join(x.decode() for g in got for x in g.get("text_output", np.array([])).reshape(-1))


def test_nvidia_end_to_end_client_request_shape_on_the_bls(dtm_server):
    greedy = LLMClient(dtm_server.grpc_url, "grpc").generate("ensemble", PROMPT, 12, **GREEDY)
    got, errs = stream_call(dtm_server.grpc_url, "tensorrt_llm_bls", _e2e_client_inputs(), ["text_output"])
    assert not errs and _text(got) == greedy.text  # temperature 1.0 without top_k/top_p: greedy
    _, errs = stream_call(dtm_server.grpc_url, "tensorrt_llm_bls", _e2e_client_inputs(beam_width=2), ["text_output"])
    assert errs and "beam_width 2 is not supported" in errs[0]


def test_an_ensemble_request_for_text_output_alone_keeps_the_engine_step(dtm_server):
    """Triton core prunes an ensemble step once every ensemble output it maps is unrequested (repository.pruned_steps);
    the engine's outputs are internal tensors, so asking for text_output alone still runs it (it came back empty
    before, on this CPU server as on a GPU one: the same core code)."""
    greedy = LLMClient(dtm_server.grpc_url, "grpc").generate("ensemble", PROMPT, 12, **GREEDY)
    assert greedy.text
    got, errs = stream_call(dtm_server.grpc_url, "ensemble", _e2e_client_inputs(), ["text_output"])
    assert not errs and _text(got) == greedy.text
    text = [g["text_output"] for g in got if "text_output" in g]
    assert len(text) == 1 and text[0].shape == (1,) and isinstance(text[0][0], bytes)  # one string per beam


def test_nvidia_end_to_end_client_inputs_with_text_and_ids_on_the_ensemble(dtm_server):
    greedy = LLMClient(dtm_server.grpc_url, "grpc").generate("ensemble", PROMPT, 12, **GREEDY)
    got, errs = stream_call(dtm_server.grpc_url, "ensemble", _e2e_client_inputs(), ["text_output", "output_ids"])
    assert not errs and _text(got) == greedy.text


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_engine_model_without_an_unguarded_parameter_fails_to_load(farm, tmp_path):
    repo = farm.copy_repo("ngram", tmp_path / "repo")
    cfg = repo / "tensorrt_llm" / "config.pbtxt"
    text = cfg.read_text()
    cut = re.sub(r'parameters \{\n  key: "tokenizer_dir"\n  value \{\n    string_value: "[^"]*"\n  \}\n\}\n', "", text)
    assert cut != text
    cfg.write_text(cut)
    server = TritonServer(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=tmp_path / "log"
    )
    with pytest.raises(ServerError):
        server.start().wait_ready(120)
    log = (tmp_path / "log").read_text()
    assert "Cannot find parameter with name: tokenizer_dir" in log


def test_nvidia_draft_target_client_calls_engines_with_unary_infer(unary_server):
    """What e2e_grpc_speculative_decoding_client.py does: unary infer on tensorrt_llm_draft and tensorrt_llm with no
    requested outputs (all come back), beam_width and temperature sent, draft_input_ids to the target."""
    c = grpcclient.InferenceServerClient(unary_server.grpc_url)
    ids = prompt_ids(unary_server)
    common = {
        "beam_width": ([[1]], np.int32),
        "temperature": ([[1.0]], np.float32),
        "end_id": ([[2]], np.int32),
        "pad_id": ([[2]], np.int32),
    }
    base = LLMClient(unary_server.grpc_url, "grpc").generate("tensorrt_llm_bls", PROMPT, 8, **GREEDY)
    seq = list(ids)
    while len(seq) < len(ids) + 8:
        d = c.infer("tensorrt_llm_draft", engine_request(seq, 3, **common))
        n = int(d.as_numpy("sequence_length").reshape(-1)[0])
        draft = [int(x) for x in d.as_numpy("output_ids").reshape(-1)[len(seq) : n]]
        t = c.infer("tensorrt_llm", engine_request(seq, len(draft) + 1, draft_input_ids=([draft], np.int32), **common))
        n = int(t.as_numpy("sequence_length").reshape(-1)[0])
        seq = [int(x) for x in t.as_numpy("output_ids").reshape(-1)[:n]]
    assert seq[len(ids) : len(ids) + 8] == base.output_ids
    with pytest.raises(
        InferenceServerException, match="Streaming is only supported if model is deployed using decoupled"
    ):
        c.infer("tensorrt_llm", engine_request(ids, 4, streaming=([[True]], bool)))
    with pytest.raises(ClientError, match="stream=true needs the decoupled deployment"):
        LLMClient(unary_server.grpc_url, "grpc").generate("tensorrt_llm_bls", PROMPT, 8, stream=True, **GREEDY)


def _serve(repo, log):
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=log)
    return server.start().wait_ready(180)


@pytest.mark.slow  # two servers of its own (~20-50 s each): `make slow`, which CI runs
def test_in_engine_modes_get_the_perf_outputs_the_backend_writes(farm, tmp_path):
    """A lookahead deployment: the engine drafts by itself (on CPU the stand-in decodes plainly), so the BLS makes ONE
    streamed engine call with return_perf_metrics, as for Medusa and EAGLE on a GPU. return_perf_metrics makes the
    backend write ten perf outputs on every response; the engine config declares them all, so Medusa/EAGLE/lookahead
    requests through the BLS are answered. The same repository with one of them left out fails every such request
    with Triton core's refusal, as the C++ backend's response would."""
    from google.protobuf import text_format

    from trt_spec.repository.writer import parse_config

    lookahead_repo = farm.repo("lookahead")
    server = _serve(lookahead_repo, tmp_path / "ok.log")
    try:
        c = LLMClient(server.grpc_url, "grpc")
        c.check_baseline()  # the ensemble runs the plain engine built beside the lookahead target
        steps = [st["model_name"] for st in c.model_config("ensemble")["ensemble_scheduling"]["step"]]
        assert steps == ["preprocessing", "tensorrt_llm_baseline", "postprocessing"]
        base = c.generate("ensemble", PROMPT, 12, **GREEDY)
        for stream in (False, True):
            spec = c.generate("tensorrt_llm_bls", PROMPT, 12, stream=stream, **GREEDY)
            assert spec.output_ids == base.output_ids and spec.metrics["total_draft_tokens"] == 0
    finally:
        server.stop()
    broken = tmp_path / "repo"
    import shutil

    shutil.copytree(lookahead_repo, broken, symlinks=True)  # as cp -r: the engine links stay links
    cfg_path = broken / "tensorrt_llm" / "config.pbtxt"
    cfg = parse_config(cfg_path)
    keep = [o for o in cfg.output if o.name != "kv_cache_alloc_new_blocks"]
    del cfg.output[:]
    cfg.output.extend(keep)
    cfg_path.write_text(text_format.MessageToString(cfg))
    # ... and its ensemble served by the speculative engine itself (what speculative.baseline_engine: false writes)
    ens_path = broken / "ensemble" / "config.pbtxt"
    ens = parse_config(ens_path)
    keep = [o for o in ens.output if o.name != "kv_cache_alloc_new_blocks"]
    del ens.output[:]
    ens.output.extend(keep)
    llm = next(st for st in ens.ensemble_scheduling.step if st.model_name == "tensorrt_llm_baseline")
    llm.model_name = "tensorrt_llm"
    del llm.output_map["kv_cache_alloc_new_blocks"]
    ens_path.write_text(text_format.MessageToString(ens))
    server = _serve(broken, tmp_path / "broken.log")
    try:
        c = LLMClient(server.grpc_url, "grpc")
        assert c.generate("ensemble", PROMPT, 12, **GREEDY).output_ids == base.output_ids  # no perf metrics asked
        for stream in (False, True):  # the engine's final response, or its first streamed one
            with pytest.raises(
                ClientError,
                match="Could not get response output for output tensor "
                "kv_cache_alloc_new_blocks: unexpected inference output 'kv_cache_alloc_new_blocks' for "
                "model 'tensorrt_llm'",
            ):
                c.generate("tensorrt_llm_bls", PROMPT, 12, stream=stream, **GREEDY)
        with pytest.raises(
            ClientError, match="no baseline: ensemble runs the speculative engine 'tensorrt_llm' itself"
        ):
            c.check_baseline()  # check / bench / tune refuse with this line
    finally:
        server.stop()


def test_the_end_token_is_not_output_and_ends_both_models(dtm_server):
    """TensorRT-LLM does not output end_id (backend_contract.EOS_EXCLUDED): with end_id set to the 4th greedy token,
    the ensemble and the BLS both return the 3 tokens before it and stop."""
    c = LLMClient(dtm_server.grpc_url, "grpc")
    greedy = c.generate("ensemble", PROMPT, 12, end_id=-1, **GREEDY).output_ids
    end = greedy[3]
    cut = greedy[: greedy.index(end)]
    for model in ("ensemble", "tensorrt_llm_bls"):
        for stream in (False, True):
            assert c.generate(model, PROMPT, 12, end_id=end, stream=stream, **GREEDY).output_ids == cut


def test_an_output_past_max_seq_len_is_lowered_not_refused_by_the_engine(dtm_server):
    """LlmRequest::validate lowers request_output_len to max_seq_len - prompt - max_draft_len (a warning in the log);
    the ensemble answers short. The BLS refuses such a request up front instead (its loop could not finish it)."""
    c = LLMClient(dtm_server.grpc_url, "grpc")
    n = len(prompt_ids(dtm_server))
    room = LIMITS["max_seq_len"] - n - K
    got = c.generate("ensemble", PROMPT, room + 5, end_id=-1, **GREEDY).output_ids
    assert len(got) == room
    assert "Number of requested output tokens is changed to" in dtm_server.log_tail(400)
    with pytest.raises(
        ClientError,
        match=rf"\+ max_draft_len \({K}\) exceeds max_seq_len 512; lower max_tokens to at most {room}",
    ):
        c.generate("tensorrt_llm_bls", PROMPT, room + 5, **GREEDY)
