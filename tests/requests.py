"""Raw requests over gRPC streams for end-to-end tests: tensors by name, one request on its own stream, no hang."""

from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

PROMPTS = ["def add(a, b):", "The quick brown fox", "import numpy as np\n", "Once upon a time"]
TIMEOUT_S = 60.0


def _tensor(name, value, dtype):
    arr = np.asarray(value, dtype=dtype)
    t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def raw(url, model, tensors, outputs=None, timeout=TIMEOUT_S):
    """One request over its own gRPC stream: ("ok", [outputs...]) or ("error", message). Never hangs: an
    unanswered request is cancelled after `timeout` and reported as ("hang", …)."""
    c = grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    finished = False
    try:
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        outs = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
        c.async_stream_infer(model, [_tensor(*t) for t in tensors], outputs=outs, enable_empty_final_response=True)
        got = []
        while True:
            try:
                result, error = q.get(timeout=timeout)
            except queue.Empty:
                return "hang", f"no final response within {timeout:.0f}s"
            if error is not None:
                finished = True
                return "error", str(getattr(error, "message", lambda: error)())
            resp = result.get_response()
            got.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
            if resp.parameters["triton_final_response"].bool_param:
                finished = True
                return "ok", got
    except Exception as e:  # client-side refusal (bad dtype for the declared input, …)
        return "error", str(e)
    finally:
        c.stop_stream(cancel_requests=not finished)
        c.close()


def text(s):
    return ("text_input", [[s.encode("utf-8") if isinstance(s, str) else s]], object)


def i32(name, v):
    return (name, [[v]], np.int32)


def f32(name, v):
    return (name, [[v]], np.float32)


def b(name, v):
    return (name, [[v]], np.bool_)


def ids(name, values):
    return (name, [list(values)], np.int32)
