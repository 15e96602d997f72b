"""NVIDIA's Triton TensorRT-LLM clients, re-enacted request by request and read response by response.

Written for these tests from a line-by-line reading of the scripts that ship with TensorRT-LLM 1.2.1's Triton backend
(NVIDIA/TensorRT-LLM `triton_backend/`, copied into the r26.04 image: tensorrtllm_backend r26.04
dockerfile/Dockerfile.triton.trt_llm_backend `COPY ... inflight_batcher_llm/client` and `tools`). Not their code:
their requests (names, dtypes, shapes, which tensors are sent when, which outputs are asked for) and their response
handling (what they index, decode, compare and stop on), each rule with the script line it comes from:

- E2E = inflight_batcher_llm/client/end_to_end_grpc_client.py
- SPEC = inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py
- SDT = tools/inflight_batcher_llm/speculative_decoding_test.py
- ETE = tools/inflight_batcher_llm/end_to_end_test.py

Every array goes on the wire as the scripts' `prepare_tensor` puts it: the numpy shape as is, the dtype by
`np_to_triton_dtype` (E2E L44-48, SPEC L17-21, utils.py L33-38). A response these clients cannot read raises here
exactly where the script would raise (an `AttributeError` from `.decode` on an array, an `IndexError`, an assert).
"""

from __future__ import annotations

import queue
from functools import partial
from typing import Optional

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

PERF_OUTPUTS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)  # E2E L288-303


def _tensor(lib, name, arr):
    t = lib.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


# -- E2E: end_to_end_grpc_client.run_inference ---------------------------------------------------------------------


def e2e_grpc(
    url: str,
    prompt: str,
    output_len: int = 100,
    *,
    model: str = "ensemble",
    streaming: bool = False,
    beam_width: int = 1,
    temperature: float = 1.0,
    exclude_input_in_output: bool = False,
    num_draft_tokens: int = 0,
    use_draft_logits: Optional[bool] = None,
    embedding_bias: Optional[tuple[list, list]] = None,
    return_perf_metrics: bool = False,
    request_id: str = "",
) -> tuple[str, list[str], dict]:
    """One prompt through E2E's run_inference: (the text it prints last, the server errors it printed, the perf metrics
    it read). Defaults are the CLI's (E2E L431-655: --model-name ensemble, -o 100, --temperature 1.0, -b 1,
    --exclude-input-in-output off = False, streaming off)."""
    ins = {
        "text_input": np.array([[prompt]]).astype(object),  # L91-92
        "max_tokens": np.ones_like(np.array([[prompt]])).astype(np.int32) * output_len,  # L93
        "stream": np.array([[streaming]], dtype=bool),  # L94, always
        "beam_width": np.array([[beam_width]], dtype=np.int32),  # L95, always
        "temperature": np.array([[temperature]], dtype=np.float32),
    }  # L96, always
    if num_draft_tokens > 0:  # L110-112
        ins["num_draft_tokens"] = np.array([[num_draft_tokens]], dtype=np.int32)
    if use_draft_logits is not None:  # L113-114
        ins["use_draft_logits"] = np.array([[use_draft_logits]], dtype=bool)
    if embedding_bias is not None:  # L153-163 (SDT passes [] and [], which are not None: [1, 0] tensors)
        words, weights = embedding_bias
        ins["embedding_bias_words"] = np.array([words], dtype=object)
        ins["embedding_bias_weights"] = np.array([weights], dtype=np.float32)
    ins["exclude_input_in_output"] = np.array([[exclude_input_in_output]], dtype=bool)  # L171-174, never None
    if return_perf_metrics:  # L190-191
        ins["return_perf_metrics"] = np.array([[True]], dtype=bool)
    outputs = ["text_output"] + (list(PERF_OUTPUTS) if return_perf_metrics else [])  # L274-303
    completed: queue.Queue = queue.Queue()

    def callback(user_data, result, error):  # L57-61
        user_data.put(error if error else result)

    client = grpcclient.InferenceServerClient(url=url)
    client.start_stream(callback=partial(callback, completed))  # L309: the stream API even when not streaming
    client.async_stream_infer(
        model,
        [_tensor(grpcclient, k, v) for k, v in ins.items()],
        outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
        request_id=request_id,
    )
    client.stop_stream()  # L319: returns when the server has closed the stream
    client.close()
    text, errors, perf = "", [], {}
    while True:  # L329-418
        try:
            result = completed.get(block=False)
        except queue.Empty:
            break
        if isinstance(result, InferenceServerException):  # L335-337: printed, not raised
            errors.append(str(result))
            continue
        output = result.as_numpy("text_output")  # L339
        batch_index = result.as_numpy("batch_index")
        batch_index = 0 if batch_index is None else batch_index[0][0]  # L341-342
        seq_index = result.as_numpy("sequence_index")
        seq_index = 0 if seq_index is None else seq_index[0][0]  # L344-345
        assert batch_index == 0 and seq_index == 0
        if streaming and beam_width == 1:  # L347-354: each response is a delta, appended
            text += output[0].decode("utf-8")
        else:  # L356-357: the last response wins
            text = output[0].decode("utf-8")
        if return_perf_metrics:  # L380-418: each read as [0][0]
            perf = {n: result.as_numpy(n)[0][0] for n in PERF_OUTPUTS}
    return text, errors, perf


# -- SPEC: e2e_grpc_speculative_decoding_client.run_speculative_inference -------------------------------------------


def speculative_client(
    url: str,
    prompt: str,
    output_len: int = 100,
    num_draft_tokens: int = 5,
    *,
    draft_model: str = "tensorrt_llm",
    target_model: str = "tensorrt_llm",
    temperature: float = 1.0,
    request_id: str = "1",
) -> str:
    """SPEC's client-side draft/target loop with unary `infer` and no requested outputs (all come back): the text it
    prints after "Final text:" (L562). Defaults are the CLI's (L375-528)."""
    c = grpcclient.InferenceServerClient(url)

    def infer(model, ins):
        return c.infer(model, [_tensor(grpcclient, k, v) for k, v in ins.items()], request_id=request_id)

    query = np.array([[prompt]]).astype(object)  # get_preprocessor_inputs L39-70 (no words, end/pad ids unset)
    pre = infer(
        "preprocessing", {"QUERY": query, "REQUEST_OUTPUT_LEN": np.ones_like(query).astype(np.int32) * output_len}
    )
    input_ids = np.squeeze(pre.as_numpy("INPUT_ID").astype(np.int32), axis=0)  # extract_preprocessor_outputs L73-81
    bad_words_ids = pre.as_numpy("BAD_WORDS_IDS").astype(np.int32)
    stop_words_ids = pre.as_numpy("STOP_WORDS_IDS").astype(np.int32)
    end_id = pre.as_numpy("OUT_END_ID").astype(np.int32)[0][0]
    pad_id = pre.as_numpy("OUT_PAD_ID").astype(np.int32)[0][0]
    prompt_input_ids = input_ids

    def trtllm_inputs(ids, out_len, draft_tokens=None):  # get_trtllm_inputs L84-163
        ins = {
            "input_ids": np.expand_dims(ids, axis=0).astype(np.int32),
            "input_lengths": np.array([[len(ids)]], dtype=np.int32),
            "request_output_len": np.array([[out_len]], dtype=np.int32),
            "bad_words_list": bad_words_ids,
            "stop_words_list": stop_words_ids,
            "beam_width": np.array([[1]], dtype=np.int32),
            "temperature": np.array([[temperature]], dtype=np.float32),
        }
        if draft_tokens is not None:
            ins["draft_input_ids"] = np.array([draft_tokens], dtype=np.int32)
        ins["end_id"] = np.array([[end_id]], dtype=np.int32)
        ins["pad_id"] = np.array([[pad_id]], dtype=np.int32)
        return ins

    def outputs(result):  # extract_trtllm_outputs L173-193
        output_ids = np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1))
        seq = result.as_numpy("sequence_length").astype(np.int32)
        assert seq.shape[0] == 1 and seq.shape[1] == 1
        return output_ids, seq[0, 0]

    while True:  # L238-359
        k = min(num_draft_tokens, len(prompt_input_ids) + output_len - len(input_ids) - 1)
        draft_output_ids = None
        if k > 0:
            draft_output_ids, draft_len = outputs(infer(draft_model, trtllm_inputs(input_ids, k)))
            draft_tokens = draft_output_ids[len(input_ids) : draft_len]  # L281
        target_output_ids, _ = outputs(
            infer(
                target_model,
                trtllm_inputs(input_ids, len(draft_tokens) + 1 if k > 0 else 1, draft_tokens if k > 0 else None),
            )
        )
        last_input_ids, input_ids = input_ids, target_output_ids  # L334-336: the whole output_ids, not cut
        length_stop = len(input_ids) >= len(prompt_input_ids) + output_len
        target_draft_equal = draft_output_ids is not None and np.array_equal(draft_output_ids, target_output_ids)
        last_current_equal = np.array_equal(last_input_ids, input_ids)
        hit_stop_words = any(np.array_equal(input_ids[-len(w) :], w) for w in stop_words_ids[0])  # L208-212
        if length_stop or target_draft_equal or last_current_equal or hit_stop_words:
            break
    post = infer(
        "postprocessing",
        {
            "TOKENS_BATCH": np.expand_dims(input_ids, axis=(0, 1)),  # L196-205
            "SEQUENCE_LENGTH": np.array([[len(input_ids)]], dtype=np.int32),
        },
    )
    return post.as_numpy("OUTPUT")[0].decode("utf8")  # L370-371


# -- SDT: speculative_decoding_test.py, one dataset row -------------------------------------------------------------


def speculative_decoding_test_row(
    url: str,
    prompt: str,
    output_len: int,
    *,
    bls: bool,
    num_draft_tokens: int = 5,
    draft_model: str = "tensorrt_llm",
    exclude_input_in_output: bool = False,
    request_id: str = "1",
) -> tuple[str, str]:
    """(control, speculative) texts, which SDT compares with `!=` (L366-386; exit status = any mismatch). Control: the
    ensemble through E2E with the empty embedding-bias pair (L301-310). Speculative: the BLS through E2E with
    num_draft_tokens and use_draft_logits=False always sent (--execute-bls-speculative-decoding, L315-343), or SPEC's
    client-side loop (the default, L344-364)."""
    control, errors, _ = e2e_grpc(
        url,
        prompt,
        output_len,
        model="ensemble",
        embedding_bias=([], []),
        exclude_input_in_output=exclude_input_in_output,
        request_id=request_id,
    )
    assert not errors, errors
    if bls:
        spec, errors, _ = e2e_grpc(
            url,
            prompt,
            output_len,
            model="tensorrt_llm_bls",
            embedding_bias=([], []),
            num_draft_tokens=num_draft_tokens,
            use_draft_logits=False,
            exclude_input_in_output=exclude_input_in_output,
            request_id=request_id,
        )
        assert not errors, errors
    else:
        spec = speculative_client(
            url,
            prompt,
            output_len,
            num_draft_tokens,
            draft_model=draft_model,
            target_model="tensorrt_llm",
            request_id=request_id,
        )
    return control, spec


# -- ETE: end_to_end_test.py test_functionality_ifb, one prompt -----------------------------------------------------


def end_to_end_test_row(url: str, prompt: str, output_len: int, *, protocol: str = "http", test_bls: bool = True):
    """ETE's unary calls (HTTP by default, L531-539): preprocessing -> tensorrt_llm -> postprocessing by hand, then the
    ensemble and (--test-bls) the BLS, each asserted equal to the hand-made text with `==` on the arrays
    (L298-376). Returns the postprocessing OUTPUT array."""
    lib = httpclient if protocol == "http" else grpcclient
    c = lib.InferenceServerClient(url)

    def infer(model, ins, outputs=None):
        return c.infer(
            model,
            [_tensor(lib, k, v) for k, v in ins.items()],
            outputs=[lib.InferRequestedOutput(n) for n in outputs] if outputs else None,
        )

    query = np.array([[prompt]]).astype(object)
    empty_words = np.array([[""]], dtype=object)
    pre = infer(
        "preprocessing",
        {
            "QUERY": query,
            "BAD_WORDS_DICT": empty_words,
            "STOP_WORDS_DICT": empty_words,
            "REQUEST_OUTPUT_LEN": np.ones_like(query).astype(np.int32) * output_len,
        },
    )  # L166-189
    llm = infer(
        "tensorrt_llm",
        {
            "input_ids": pre.as_numpy("INPUT_ID"),
            "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),  # always sent
            "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
            "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
            "end_id": pre.as_numpy("OUT_END_ID"),
            "pad_id": pre.as_numpy("OUT_PAD_ID"),
        },
    )  # L191-237
    output0 = llm.as_numpy("output_ids").astype(np.int32)
    seq_lengths = llm.as_numpy("sequence_length")
    output0 = infer("postprocessing", {"TOKENS_BATCH": output0, "SEQUENCE_LENGTH": seq_lengths}).as_numpy("OUTPUT")
    text_ins = {
        "text_input": query,
        "max_tokens": np.ones_like(query).astype(np.int32) * output_len,
        "bad_words": empty_words,
        "stop_words": empty_words,
    }  # L251-296: no stream/beam/temperature/exclude
    ensemble_output = infer("ensemble", text_ins, ["text_output"]).as_numpy("text_output")
    assert output0 == ensemble_output  # L298-300
    if test_bls:
        bls_output = infer("tensorrt_llm_bls", text_ins, ["text_output"]).as_numpy("text_output")
        assert output0 == bls_output  # L375-376
    return output0
