"""postprocessing: token ids -> text (python backend). TOKENS_BATCH [B, beams, T], SEQUENCE_LENGTH [B, beams].

Outputs in NVIDIA's shapes (all_models/inflight_batcher_llm/postprocessing): OUTPUT is one string per sequence and
beam, flat ([B * beams]), which NVIDIA's clients read as `as_numpy("OUTPUT")[0].decode()`; a [B, beams] array would
hand them an array where they expect bytes. OUTPUT_IDS (trt-spec's own) is TOKENS_BATCH cut to the longest
SEQUENCE_LENGTH, the ensemble's `output_ids`.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trt_spec.in_triton.serving import (
    enable_crash_traces,
    end_if_cut,
    load_tokenizer,
    requested_only,
    resolve_path_parameters,
    respond_each,
)
from trt_spec.records.names import POST_OUTPUT_IDS, POSTPROCESSING, Post


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        params = resolve_path_parameters(json.loads(args["model_config"]), args["model_repository"])["parameters"]
        self.tokenizer = load_tokenizer(params["tokenizer_dir"]["string_value"])
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true") == "true"

    def execute(self, requests):
        return respond_each(requests, self._one, POSTPROCESSING, pb_utils)

    def _one(self, request):
        end_if_cut()  # an ensemble request still streaming when the drain timeout passed gets a clear error
        tokens = pb_utils.get_input_tensor_by_name(request, Post.TOKENS_BATCH).as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, Post.SEQUENCE_LENGTH).as_numpy()
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        lengths = lengths.reshape(tokens.shape[0], -1)
        texts = []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                n = int(lengths[b, beam])
                texts.append(
                    self.tokenizer.decode(tokens[b, beam, :n].tolist(), skip_special_tokens=self.skip_special).encode(
                        "utf-8"
                    )
                )
        longest = int(lengths.max()) if lengths.size else 0
        outputs = {
            Post.OUTPUT: np.array(texts, dtype=object),
            POST_OUTPUT_IDS: np.ascontiguousarray(tokens[:, :, :longest], dtype=np.int32),
        }
        return pb_utils.InferenceResponse(
            output_tensors=[  # the stub drops others without the GIL (requested_only)
                pb_utils.Tensor(k, v) for k, v in requested_only(outputs, request.requested_output_names()).items()
            ]
        )
