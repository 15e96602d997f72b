"""NVIDIA's own clients against trt-spec's CPU deployment, as they are: their requests and their response handling
(tests/e2e/nvidia_clients.py, each rule with its script line), on the decoupled repository (trt-spec's default) and
the `--no-decoupled` one (NVIDIA's DTM recipe).

The deployment is draft-target with max_draft_len 5, the num_draft_tokens NVIDIA's scripts send by default. Scripts
that call models with unary `infer` (SPEC, ETE) need non-decoupled engine models: on the decoupled repository
Triton core refuses them, as it would on a GPU, and the test pins that message (docs/serving.md: "NVIDIA's clients")."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trt_spec.harness.client import GREEDY, LLMClient

from . import nvidia_clients as nv

PROMPTS = ["def add(a, b):\n    return", "The quick brown fox", "Hello, world! What is"]
OUT = 16


@pytest.fixture(scope="module")
def deployments(dtm_server, unary_server):
    """The farm's draft-target deployment (max_draft_len 5), decoupled and --no-decoupled."""
    return {"decoupled": dtm_server, "unary": unary_server}


def _completion(server, prompt):
    """The target's greedy completion (trt-spec's own client, token ids and text)."""
    return LLMClient(server.grpc_url, "grpc").generate("ensemble", prompt, OUT, **GREEDY)


@pytest.mark.parametrize("kind", ["decoupled", "unary"])
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_reads_the_text(deployments, kind, model):
    """E2E with its defaults (non-streaming, exclude_input_in_output False): the text is prompt + completion; it
    reads text_output[0].decode() (a [1, 1] text died here with "'numpy.ndarray' object has no attribute
    'decode'", and the ensemble answered nothing when its engine step was pruned)."""
    server = deployments[kind]
    for prompt in PROMPTS:
        want = _completion(server, prompt).text
        assert want
        text, errors, _ = nv.e2e_grpc(server.grpc_url, prompt, OUT, model=model)
        assert not errors and text == prompt + want


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_streams_the_completion_alone(deployments, tiny_models, model):
    """E2E -S (decoupled only): each response's text_output[0] is a delta; they add up to the completion without the
    prompt, whatever exclude_input_in_output says (the engine ignores it when streaming). The ensemble decodes each
    engine response on its own, as NVIDIA's postprocessing does (a character split across tokens comes out as
    replacement characters); the BLS holds back incomplete characters, so its deltas add up to the whole text."""
    from trt_spec.in_triton.serving import load_tokenizer

    tok = load_tokenizer(str(tiny_models["tokenizer"]))
    server = deployments["decoupled"]
    for prompt in PROMPTS:
        done = _completion(server, prompt)
        want = (
            done.text
            if model == "tensorrt_llm_bls"
            else "".join(tok.decode([t], skip_special_tokens=True) for t in done.output_ids)
        )
        assert want
        for exclude in (False, True):
            text, errors, _ = nv.e2e_grpc(
                server.grpc_url, prompt, OUT, model=model, streaming=True, exclude_input_in_output=exclude
            )
            assert not errors and text == want


def test_end_to_end_grpc_client_reads_the_perf_metrics_of_the_ensemble(deployments):
    """E2E --return-perf-metrics reads the ten perf outputs as [0][0]: the ensemble declares and maps them, and the
    engine writes them on every response when asked (backend_contract.PERF_OUTPUTS)."""
    server = deployments["decoupled"]
    text, errors, perf = nv.e2e_grpc(server.grpc_url, PROMPTS[0], OUT, return_perf_metrics=True)
    assert not errors and text
    assert set(perf) == set(nv.PERF_OUTPUTS)
    assert (
        perf["arrival_time_ns"]
        <= perf["first_scheduled_time_ns"]
        <= perf["first_token_time_ns"]
        <= perf["last_token_time_ns"]
    )
    assert perf["kv_cache_alloc_total_blocks"] >= 1 and perf["total_draft_tokens"] == 0  # the ensemble drafts nothing


@pytest.mark.parametrize("streaming", [False, True])
def test_end_to_end_grpc_client_reads_the_perf_metrics_of_the_bls(deployments, streaming):
    """E2E --model-name tensorrt_llm_bls --return-perf-metrics [-S] requests the ten perf outputs NVIDIA's BLS config
    declares and reads each as [0][0] on every response: Triton core refused the request while the BLS declared three
    ("unexpected inference output 'kv_cache_alloc_new_blocks'"). They are the whole request's: KV blocks summed over
    every engine call of the speculative rounds, the first call's arrival, the last target call's last token, and
    the loop's acceptance (what trt-spec's own client reads in the final response)."""
    server = deployments["decoupled"]
    text, errors, perf = nv.e2e_grpc(
        server.grpc_url, PROMPTS[0], OUT, model="tensorrt_llm_bls", streaming=streaming, return_perf_metrics=True
    )
    assert not errors and text
    assert set(perf) == set(nv.PERF_OUTPUTS)
    assert (
        0
        < perf["arrival_time_ns"]
        <= perf["first_scheduled_time_ns"]
        <= perf["first_token_time_ns"]
        <= perf["last_token_time_ns"]
    )
    assert perf["kv_cache_alloc_total_blocks"] >= 2  # a draft call and a target call at least, each >= one block
    assert perf["kv_cache_alloc_total_blocks"] == perf["kv_cache_alloc_new_blocks"] + perf["kv_cache_reused_blocks"]
    drafted, accepted = perf["total_draft_tokens"], perf["total_accepted_draft_tokens"]
    assert 0 <= accepted <= drafted and drafted > 0
    assert abs(perf["acceptance_rate"] - accepted / drafted) < 1e-6


@pytest.mark.parametrize("kind", ["decoupled", "unary"])
def test_speculative_decoding_test_with_the_bls_finds_no_mismatch(deployments, kind):
    """SDT --execute-bls-speculative-decoding: control (ensemble) and speculative (BLS, num_draft_tokens 5,
    use_draft_logits False, empty embedding bias) texts must be equal, or it exits 1."""
    server = deployments[kind]
    for i, prompt in enumerate(PROMPTS, 1):
        for exclude in (False, True):  # the flag of the 1cee55d0 variant
            control, spec = nv.speculative_decoding_test_row(
                server.grpc_url, prompt, OUT, bls=True, exclude_input_in_output=exclude, request_id=str(i)
            )
            assert control and control == spec


def test_speculative_client_and_decoding_test_on_the_unary_repository(deployments):
    """SPEC's client-side loop (unary infer on preprocessing, tensorrt_llm_draft, tensorrt_llm, postprocessing; no
    requested outputs) and SDT's default path built on it: the same text as the ensemble."""
    server = deployments["unary"]
    for i, prompt in enumerate(PROMPTS, 1):
        want = prompt + _completion(server, prompt).text
        assert (
            nv.speculative_client(
                server.grpc_url, prompt, OUT, draft_model="tensorrt_llm_draft", target_model="tensorrt_llm"
            )
            == want
        )
        control, spec = nv.speculative_decoding_test_row(
            server.grpc_url, prompt, OUT, bls=False, draft_model="tensorrt_llm_draft", request_id=str(i)
        )
        assert control == spec == want


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_end_to_end_test_on_the_unary_repository(deployments, protocol):
    """ETE (HTTP by default): preprocessing -> tensorrt_llm (with decoder_input_ids, always sent) -> postprocessing by
    hand must equal the ensemble's and the BLS's text_output (`assert output0 == ensemble_output`)."""
    server = deployments["unary"]
    url = server.http_url if protocol == "http" else server.grpc_url
    for prompt in PROMPTS:
        out = nv.end_to_end_test_row(url, prompt, OUT, protocol=protocol)
        assert out.shape == (1,) and out[0].decode() == prompt + _completion(server, prompt).text


def test_unary_clients_on_the_decoupled_repository_get_tritons_refusal(deployments):
    """SPEC and ETE call the engine with unary infer; Triton core refuses that on a decoupled model (on a GPU too).
    The message names the problem; docs/serving.md tells users of these scripts to write the repository with
    --no-decoupled."""
    server = deployments["decoupled"]
    with pytest.raises(InferenceServerException, match="decoupled"):
        nv.speculative_client(server.grpc_url, PROMPTS[0], OUT, draft_model="tensorrt_llm_draft")
    with pytest.raises(InferenceServerException, match="decoupled"):
        nv.end_to_end_test_row(server.grpc_url, PROMPTS[0], OUT, protocol="grpc")


def test_a_non_empty_embedding_bias_is_refused_in_one_line(deployments):
    server = deployments["decoupled"]
    for model in ("ensemble", "tensorrt_llm_bls"):
        _, errors, _ = nv.e2e_grpc(server.grpc_url, PROMPTS[0], OUT, model=model, embedding_bias=([" fox"], [-20.0]))
        assert errors and "embedding_bias_words is not supported by this deployment" in errors[0]
    c = grpcclient.InferenceServerClient(server.grpc_url)
    assert c.is_server_live()  # and the server stays up
