"""The OpenAI frontend's client of the models: Triton's gRPC streaming API over grpc.aio, one call per request.

The final response is always flagged (upstream-facts: triton-grpc-final-response-flag), so every generation ends the
same way, streamed or not; closing a call early cancels the request in Triton.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import AsyncIterator, Optional

import numpy as np

from ...errors import TrtSpecError
from ...in_triton.serving import SHUTTING_DOWN
from ...records import llmapi_contract as lc
from ...records.names import LIST_METRICS, METRIC_OUTPUTS, OUTPUT_IDS
from .metrics import LLMAPI_SPEC_OUTPUTS

LLMAPI_OUTPUTS = ("finish_reason", *LLMAPI_SPEC_OUTPUTS)  # beside text_output


class TritonCallError(TrtSpecError):
    """A model's error response or Triton unreachable, with the HTTP status to report."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _status_of(message: str) -> int:
    """HTTP status from a stream error's text: 503 draining (clients retry elsewhere), 500 internal, else 400."""
    if SHUTTING_DOWN in message:
        return 503
    return 500 if "internal error" in message else 400


def _encode_input(name: str, arr: np.ndarray, request) -> None:
    from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

    t = request.inputs.add()
    t.name, t.datatype = name, np_to_triton_dtype(arr.dtype) if arr.dtype != object else "BYTES"
    t.shape.extend(arr.shape)
    if arr.dtype == object:  # BYTES: tritonclient's length-prefixed encoding
        serialized = serialize_byte_tensor(arr)
        request.raw_input_contents.append(serialized.item() if serialized.size > 0 else b"")
    else:
        request.raw_input_contents.append(arr.tobytes())


def _store_metrics(result, into: dict) -> None:
    for name in METRIC_OUTPUTS:
        arr = result.as_numpy(name)
        if arr is not None:
            flat = arr.reshape(-1)
            into[name] = [int(x) for x in flat] if name in LIST_METRICS else flat[0].item()


def _text(v) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


class TritonModels:
    """Requests to the models over one gRPC channel."""

    def __init__(self, url: str):
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.url = url
        self.channel = grpc.aio.insecure_channel(
            url, options=[("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)]
        )
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def ready(self) -> bool:
        from tritonclient.grpc import service_pb2

        try:
            return (await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5)).ready
        except Exception:  # noqa: BLE001 - unreachable is not ready
            return False

    async def generate(
        self, model: str, tensors: dict[str, np.ndarray], metrics: Optional[dict] = None
    ) -> AsyncIterator[list[int]]:
        """New token ids per response until the final one; closing the iterator early cancels the request.

        With `metrics` (speculative model only), the BLS's METRIC_OUTPUTS are stored in it as they come."""
        wanted = [OUTPUT_IDS, *(METRIC_OUTPUTS if metrics is not None else ())]
        async with aclosing(self._responses(model, tensors, wanted)) as responses:
            async for result in responses:
                ids = result.as_numpy(OUTPUT_IDS)
                if metrics is not None:
                    _store_metrics(result, metrics)
                yield [int(x) for x in ids.reshape(-1)] if ids is not None else []

    async def generate_text(self, model: str, tensors: dict[str, np.ndarray], outputs: dict) -> AsyncIterator[str]:
        """runtime llmapi: yields each response's text_output, the WHOLE text so far, not a delta
        (upstream-facts: llmapi-cumulative-text-output); its other outputs are stored in `outputs`."""
        wanted = [lc.TEXT_OUTPUT, *LLMAPI_OUTPUTS]
        async with aclosing(self._responses(model, tensors, wanted)) as responses:
            async for result in responses:
                for name in LLMAPI_OUTPUTS:
                    arr = result.as_numpy(name)
                    if arr is not None and arr.size:
                        outputs[name] = arr.reshape(-1)[0]
                text = result.as_numpy(lc.TEXT_OUTPUT)
                yield "" if text is None or not text.size else _text(text.reshape(-1)[0])

    async def _responses(self, model: str, tensors: dict[str, np.ndarray], wanted: list[str]):
        """One streaming call: the InferResult of every response until the flagged final one."""
        import grpc
        from tritonclient.grpc import InferResult, service_pb2

        req = service_pb2.ModelInferRequest(model_name=model, id=uuid.uuid4().hex)
        for name, arr in tensors.items():
            _encode_input(name, arr, req)
        for name in wanted:
            req.outputs.add(name=name)
        req.parameters["triton_enable_empty_final_response"].bool_param = True

        async def one():
            yield req

        call = self.stub.ModelStreamInfer(one())
        try:
            async for resp in call:
                if resp.error_message:
                    msg = resp.error_message.strip()
                    raise TritonCallError(msg, _status_of(msg))
                yield InferResult(resp.infer_response)
                final = resp.infer_response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                raise asyncio.CancelledError() from None
            status = 503 if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 500
            raise TritonCallError(f"Triton at {self.url}: {e.details() or e.code().name}", status) from None
        finally:
            call.cancel()  # a no-op once the call is done
