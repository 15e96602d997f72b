"""postprocessing: token ids -> text (python backend). TOKENS_BATCH [B, beams, T], SEQUENCE_LENGTH [B, beams]."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trt_spec.names import POSTPROCESSING
from trt_spec.serving import enable_crash_traces, load_tokenizer, respond_each


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = load_tokenizer(params["tokenizer_dir"]["string_value"])
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true") == "true"

    def execute(self, requests):
        return respond_each(requests, self._one, POSTPROCESSING, pb_utils)

    def _one(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        lengths = lengths.reshape(tokens.shape[0], -1)
        texts = []
        for b in range(tokens.shape[0]):
            row = []
            for beam in range(tokens.shape[1]):
                n = int(lengths[b, beam])
                row.append(self.tokenizer.decode(tokens[b, beam, :n].tolist(),
                                                 skip_special_tokens=self.skip_special).encode("utf-8"))
            texts.append(row)
        out = np.array(texts, dtype=object)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)])
