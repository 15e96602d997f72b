"""tensorrt_llm / tensorrt_llm_draft on CPU: the trt-spec reference engine behind the TensorRT-LLM backend's
core tensor interface (python backend, decoupled).

input_ids [1, L], input_lengths, request_output_len, draft_input_ids [1, k], draft_logits [1, k, V], end_id,
stop_words_list, temperature, runtime_top_k, runtime_top_p, seed, streaming, exclude_input_in_output,
return_generation_logits, return_perf_metrics -> output_ids [1, 1, T], sequence_length [1, 1],
generation_logits [1, 1, T, V], acceptance_rate, total_accepted_draft_tokens, total_draft_tokens.
Streaming sends one response per token; otherwise exactly one response. See trt_spec/reference/engine.py.
"""

import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from trt_spec.reference.engine import ReferenceEngine, Sampling, load_engine
from trt_spec.serving import from_word_list, scalar

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _in(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        p = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        threads = int(os.environ.get("TRT_SPEC_TORCH_THREADS", "0")) or torch.get_num_threads()
        torch.set_num_threads(threads)
        model = load_engine(p["engine_dir"])
        self.engine = ReferenceEngine(model, int(p["max_seq_len"]), int(p.get("prefix_cache_mb", "512")) * 2**20,
                                      diverge_slack=int(p.get("max_draft_len", "0")) + 1)
        self.name = args["model_name"]

    def _outputs(self, request, tokens, input_ids, res, *, final):
        exclude = bool(scalar(_in(request, "exclude_input_in_output"), False))
        ids = tokens if (exclude or not final) else list(input_ids) + list(tokens)
        outs = [pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)),
                pb_utils.Tensor("sequence_length", np.asarray([[len(ids)]], dtype=np.int32))]
        if final and res is not None:
            if bool(scalar(_in(request, "return_generation_logits"), False)) and res.logits:
                logits = torch.stack(res.logits).float().numpy()[None, None]
                outs.append(pb_utils.Tensor("generation_logits", logits))
            if bool(scalar(_in(request, "return_perf_metrics"), False)):
                rate = res.accepted / res.drafted if res.drafted else 0.0
                outs += [pb_utils.Tensor("acceptance_rate", np.asarray([[rate]], dtype=np.float32)),
                         pb_utils.Tensor("total_accepted_draft_tokens", np.asarray([[res.accepted]], dtype=np.int32)),
                         pb_utils.Tensor("total_draft_tokens", np.asarray([[res.drafted]], dtype=np.int32))]
        return pb_utils.InferenceResponse(output_tensors=outs)

    def _one(self, request, sender):
        ids = _in(request, "input_ids")
        if ids is None or ids.size == 0:
            raise ValueError("input_ids is empty")
        if ids.shape[0] != 1:
            raise ValueError(f"{self.name} takes one sequence per request, got a batch of {ids.shape[0]}")
        length = scalar(_in(request, "input_lengths"), ids.shape[-1], int)
        input_ids = [int(x) for x in ids.reshape(-1)[:length]]
        out_len = scalar(_in(request, "request_output_len"), None, int)
        if out_len is None or out_len < 1:
            raise ValueError(f"request_output_len must be >= 1, got {out_len}")
        if _in(request, "bad_words_list") is not None and from_word_list(_in(request, "bad_words_list")[0]):
            raise ValueError("bad_words is not supported by the reference engine; drop it from the request")
        sampling = Sampling(float(scalar(_in(request, "temperature"), 0.0)), scalar(_in(request, "runtime_top_k"), 0, int),
                            float(scalar(_in(request, "runtime_top_p"), 1.0)), scalar(_in(request, "seed"), None, int))
        end_id = scalar(_in(request, "end_id"), None, int)
        stop = _in(request, "stop_words_list")
        stop_words = from_word_list(stop[0]) if stop is not None else []
        draft = _in(request, "draft_input_ids")
        draft = [int(x) for x in draft.reshape(-1)] if draft is not None else []
        streaming = bool(scalar(_in(request, "streaming"), False))

        if draft:
            dl = _in(request, "draft_logits")
            dl = torch.from_numpy(np.asarray(dl).reshape(-1, np.asarray(dl).shape[-1])) if dl is not None else None
            res = self.engine.verify(input_ids, draft[: out_len - 1] if out_len > 1 else [], sampling,
                                     draft_logits=dl, end_id=end_id)
            sender.send(self._outputs(request, res.tokens, input_ids, res, final=True), flags=FINAL)
            return
        on_token = None
        if streaming:
            on_token = lambda t: sender.send(self._outputs(request, [t], input_ids, None, final=False))  # noqa: E731
        res = self.engine.generate(input_ids, out_len, sampling, end_id=end_id, stop_words=stop_words,
                                   return_logits=bool(scalar(_in(request, "return_generation_logits"), False)),
                                   on_token=on_token)
        if streaming:
            sender.send(flags=FINAL)
        else:
            sender.send(self._outputs(request, res.tokens, input_ids, res, final=True), flags=FINAL)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._one(request, sender)
            except (ValueError, TypeError, IndexError) as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.name}: {e}")), flags=FINAL)
        return None
