"""tensorrt_llm / tensorrt_llm_draft on CPU: the trt-spec reference engine behind the `tensorrtllm` backend's
contract (python backend).

The stand-in is at least as strict as the backend it stands in for: it refuses to load without the
parameters the backend reads unguarded, rejects every request the backend or the executor rejects (missing
mandatory outputs, streaming on a non-decoupled model, too many draft tokens, a prompt over the engine's
input limit, beam width or return sequences other than 1) with their own error text, samples like
TensorRT-LLM (no top_k and no top_p: greedy at any temperature) and returns the backend's outputs in its
shapes. Every rule and its source: trt_spec/backend_contract.py. The engine itself: trt_spec/reference/engine.py.
"""

import json
import os
import time

import torch
import triton_python_backend_utils as pb_utils

from trt_spec import backend_contract as bc
from trt_spec.defaults import PREFIX_CACHE_TOKENS
from trt_spec.integrity import verify_served_engine
from trt_spec.reference.engine import ReferenceEngine, Sampling, kv_bytes_per_position, load_engine
from trt_spec.reference.export import read_engine_meta
from trt_spec.serving import enable_crash_traces, error_line

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUT_NAMES = tuple(t.name for t in bc.INPUTS)
# The executor refuses a speculative target without KV-cache block reuse (draft tokens are verified against
# the reused prefix): TensorRT-LLM 1.2 trtGptModelInflightBatching.cpp.
REUSE_REQUIRED = "KV cache block reuse must be enabled for speculative decoding target model"


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        cfg = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.params = {k: v.get("string_value", "") for k, v in cfg["parameters"].items()}
        bc.check_parameters(self.params)  # raises: the model fails to load, as on a GPU
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
        engine_dir = self.params["gpt_model_path"]
        if not os.path.isdir(engine_dir):
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=bc.MODEL_PATHS_EMPTY))
        # the engine must match the build's checksums (stored in trt_spec_repo.json at the repository root)
        verify_served_engine(os.path.dirname(os.path.abspath(args["model_repository"])), engine_dir)
        model = load_engine(engine_dir)
        self.limits = bc.EngineLimits.from_build_config(read_engine_meta(engine_dir)["build_config"],
                                                        vocab_size=model.config.vocab_size)
        # Cancelled requests stop between tokens, checked at most this often (the backend polls the same way).
        self.cancel_period_s = int(bc.parameter(self.params, "cancellation_check_period_ms")) / 1000.0
        reuse = bc.parse_bool(bc.parameter(self.params, "enable_kv_cache_reuse"), "enable_kv_cache_reuse")
        if self.limits.speculative_decoding_mode == "draft_tokens_external" and not reuse:
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=REUSE_REQUIRED))
        threads = int(os.environ.get("TRT_SPEC_TORCH_THREADS", "0")) or torch.get_num_threads()
        torch.set_num_threads(threads)
        tokens = bc.parameter(self.params, "max_tokens_in_paged_kv_cache")
        budget = (int(tokens) if tokens else PREFIX_CACHE_TOKENS) * kv_bytes_per_position(model) if reuse else 0
        self.engine = ReferenceEngine(model, self.limits.max_seq_len, budget,
                                      diverge_slack=self.limits.max_draft_len + 1)

    def _inputs(self, request):
        out = {}
        for name in INPUT_NAMES:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                out[name] = t.as_numpy()
        return out

    def _response(self, req, tokens, res=None):
        logits = torch.stack(res.logits).float().numpy() if res is not None and res.logits else None
        tensors = bc.response_tensors(req, tokens, accepted=res.accepted if res else 0,
                                      drafted=res.drafted if res else 0, logits=logits)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

    def _cancel_check(self, request):
        """should_stop for the engine: request.is_cancelled() (an IPC round trip) after the first token, then at
        most once per period."""
        last = [float("-inf")]

        def cancelled() -> bool:
            now = time.monotonic()
            if now - last[0] < self.cancel_period_s:
                return False
            last[0] = now
            return request.is_cancelled()
        return cancelled

    def _one(self, request, send):
        req = bc.parse_request(self._inputs(request), request.requested_output_names(), self.limits, self.params,
                               decoupled=self.decoupled)
        if request.is_cancelled():  # cancelled while queued: finish it at once, as the executor does
            send(self._response(req, []), FINAL)
            return
        if req.bad_words:
            raise bc.ContractError("bad_words is not supported by the reference engine; drop it from the request")
        greedy = req.greedy
        sampling = Sampling(0.0 if greedy else req.temperature, 0 if greedy else req.top_k,
                            1.0 if greedy or req.top_p == 0.0 else req.top_p, req.seed)
        if req.draft_tokens:
            dl = torch.from_numpy(req.draft_logits) if req.draft_logits is not None else None
            draft = req.draft_tokens[: req.output_len - 1] if req.output_len > 1 else []
            res = self.engine.verify(req.input_ids, draft, sampling, draft_logits=dl, end_id=req.end_id)
            send(self._response(req, res.tokens, res), FINAL)
            return
        on_token = None
        if req.streaming:
            on_token = lambda t: send(self._response(req, [t]), 0)  # noqa: E731
        res = self.engine.generate(req.input_ids, req.output_len, sampling, end_id=req.end_id,
                                   stop_words=req.stop_words, return_logits=req.return_generation_logits,
                                   on_token=on_token, should_stop=self._cancel_check(request))
        if req.streaming:
            send(None, FINAL)
        else:
            send(self._response(req, res.tokens, res), FINAL)

    def execute(self, requests):
        responses = []
        for request in requests:
            final = []  # set once the request's final response is out

            if self.decoupled:
                sender = request.get_response_sender()

                def send(r, flags, s=sender, final=final):
                    if flags & FINAL:  # before sending: a failed final send still deletes the response factory
                        final.append(True)
                    s.send(r, flags=flags) if r is not None else s.send(flags=flags)
            else:
                def send(r, flags, final=final):
                    responses.append(r)
                    final.append(True)
            try:
                self._one(request, send)
                continue
            except Exception as e:  # noqa: BLE001 - client mistakes get their line; our faults are logged in full
                error = error_line(self.name, e, pb_utils.Logger.log_error)
            # Every request gets a final response, whatever happened: a decoupled request left without one
            # would keep its caller (the BLS, a client stream) waiting forever.
            if final:
                pb_utils.Logger.log_error(f"{self.name}: after the final response: {error}")
                continue
            try:
                send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), FINAL)
            except Exception as e:  # noqa: BLE001 - never let one request's failure fail the batch
                pb_utils.Logger.log_error(f"{self.name}: the final error response failed: {e}")
        return None if self.decoupled else responses
