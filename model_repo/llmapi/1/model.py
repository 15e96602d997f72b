"""tensorrt_llm / tensorrt_llm_baseline of a CPU `runtime: llmapi` deployment: the stand-in of TensorRT-LLM's LLM-API
Triton model (python backend), a thin adapter over trt_spec/in_triton/llmapi_standin.py. It reads the same model.yaml as
NVIDIA's model.py (next to this file; triton_config for the transaction policy) and answers the same tensors; on a
GPU host the repository holds NVIDIA's model.py instead."""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from trt_spec.in_triton.llmapi_standin import LlmapiError, LlmapiStandIn
from trt_spec.in_triton.serving import collect_at_finalize, enable_crash_traces, error_line, request_inputs
from trt_spec.records import llmapi_contract as lc

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUT_NAMES = tuple(t.name for t in lc.INPUTS)


def _tensors(out):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, np.asarray(v)) for k, v in out.items()])


def _error(msg):
    # MODEL: an error response carries text_output ["N/A"] with the error
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(lc.TEXT_OUTPUT, np.array([b"N/A"], dtype=object))],
        error=pb_utils.TritonError(msg),
    )


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        self.name = args["model_name"]
        cfg = json.loads(args["model_config"])
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
        here = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(here, lc.YAML_FILE)) as f:
            y = yaml.safe_load(f)
        self.model = LlmapiStandIn(
            {k: v for k, v in y.items() if k != lc.TRITON_KEY}, decoupled=self.decoupled, name=self.name
        )

    def finalize(self):
        self.model.close()
        collect_at_finalize()

    def _inputs(self, request):
        return request_inputs(pb_utils, request, INPUT_NAMES)

    async def _one(self, request, send):
        try:
            r = self.model.parse(self._inputs(request))
            final = await self.model.generate(r, lambda out: send(_tensors(out), 0), request.is_cancelled)
            send(_tensors(final), FINAL)
        except LlmapiError as e:
            send(_error(str(e)), FINAL)
        except Exception as e:  # noqa: BLE001 - every request gets an answer; our faults are logged in full
            send(_error(lc.GENERATION_ERROR.format(msg=error_line(self.name, e, pb_utils.Logger.log_error))), FINAL)

    async def execute(self, requests):
        if self.decoupled:

            def sender(request):
                s = request.get_response_sender()
                return lambda resp, flags: s.send(resp, flags=flags)

            await asyncio.gather(*(self._one(r, sender(r)) for r in requests))
            return None
        results = [None] * len(requests)

        def keep(i):
            return lambda resp, flags: results.__setitem__(i, resp) if flags & FINAL else None

        await asyncio.gather(*(self._one(r, keep(i)) for i, r in enumerate(requests)))
        return results
