"""preprocessing: text -> token ids in TensorRT-LLM's tensor format (python backend).

Inputs QUERY, REQUEST_OUTPUT_LEN, BAD_WORDS_DICT, STOP_WORDS_DICT, END_ID, PAD_ID, EMBEDDING_BIAS_WORDS/WEIGHTS (empty
only) -> outputs INPUT_ID, REQUEST_INPUT_LEN, REQUEST_OUTPUT_LEN, BAD_WORDS_IDS, STOP_WORDS_IDS, OUT_END_ID, OUT_PAD_ID,
DECODER_INPUT_ID (NVIDIA's names and shapes; NVIDIA's clients read them).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trt_spec.in_triton.serving import (
    check_input_bytes,
    check_no_embedding_bias,
    decode_strings,
    default_end_id,
    default_pad_id,
    enable_crash_traces,
    encode,
    input_byte_limit,
    load_tokenizer,
    refuse_if_draining,
    resolve_path_parameters,
    respond_each,
    scalar,
    to_word_list,
)
from trt_spec.in_triton.speculative_loop import RequestError, check_prompt_len
from trt_spec.records.bls_parameters import PreprocessingParameters
from trt_spec.records.names import BAD_WORDS, MAX_TOKENS, PREPROCESSING, STOP_WORDS, TEXT_INPUT, Pre


def _get(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        params = resolve_path_parameters(json.loads(args["model_config"]), args["model_repository"])["parameters"]
        p = PreprocessingParameters.from_parameters({k: v.get("string_value", "") for k, v in params.items()})
        self.tokenizer = load_tokenizer(p.tokenizer_dir)
        self.max_input_len = p.max_input_len
        self.add_special = p.add_special_tokens
        self.byte_limit = input_byte_limit(self.tokenizer, self.max_input_len)  # checked before tokenizing

    def _one(self, request):
        refuse_if_draining()  # the ensemble's first step: a new request, refused while the server drains
        check_no_embedding_bias(_get(request, Pre.EMBEDDING_BIAS[0]), _get(request, Pre.EMBEDDING_BIAS[1]))
        for name, client_name in ((Pre.QUERY, TEXT_INPUT), (Pre.STOP_WORDS, STOP_WORDS), (Pre.BAD_WORDS, BAD_WORDS)):
            check_input_bytes(_get(request, name), self.byte_limit, client_name, self.max_input_len)
        queries = decode_strings(_get(request, Pre.QUERY))
        if not queries or any(not q for q in queries):
            raise RequestError(f"{TEXT_INPUT} is empty; send a non-empty prompt")
        out_len = np.asarray(_get(request, Pre.REQUEST_OUTPUT_LEN)).reshape(-1, 1).astype(np.int32)
        if int(out_len.min()) <= 0:
            raise RequestError(f"{MAX_TOKENS} must be >= 1, got {int(out_len.min())}")
        ids = [encode(self.tokenizer, q, self.add_special) for q in queries]
        longest = max(len(i) for i in ids)
        check_prompt_len(longest, self.max_input_len)
        end_id = scalar(_get(request, Pre.END_ID), default_end_id(self.tokenizer), int)
        pad_id = scalar(_get(request, Pre.PAD_ID), default_pad_id(self.tokenizer), int)
        batch = len(ids)
        input_id = np.full((batch, longest), pad_id, dtype=np.int32)
        for b, seq in enumerate(ids):
            input_id[b, : len(seq)] = seq
        lengths = np.array([[len(s)] for s in ids], dtype=np.int32)
        bad = to_word_list(self.tokenizer, decode_strings(_get(request, Pre.BAD_WORDS)))
        stop = to_word_list(self.tokenizer, decode_strings(_get(request, Pre.STOP_WORDS)))
        tile = lambda a: np.repeat(a[None], batch, axis=0)  # noqa: E731
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(Pre.INPUT_ID, input_id),
                pb_utils.Tensor(Pre.REQUEST_INPUT_LEN, lengths),
                pb_utils.Tensor(Pre.REQUEST_OUTPUT_LEN, out_len),
                pb_utils.Tensor(Pre.BAD_WORDS_IDS, tile(bad)),
                pb_utils.Tensor(Pre.STOP_WORDS_IDS, tile(stop)),
                pb_utils.Tensor(Pre.OUT_END_ID, np.full((batch, 1), end_id, dtype=np.int32)),
                pb_utils.Tensor(Pre.OUT_PAD_ID, np.full((batch, 1), pad_id, dtype=np.int32)),
                pb_utils.Tensor(
                    Pre.DECODER_INPUT_ID, np.full((batch, 1), pad_id, dtype=np.int32)
                ),  # decoder-only: unused
            ]
        )

    def execute(self, requests):
        return respond_each(requests, self._one, PREPROCESSING, pb_utils)
