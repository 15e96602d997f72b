"""Python models send exactly the outputs a request names: the backend fills only requested token outputs, and
Triton 2.51's python backend would drop anything else with the GIL released (python_backend #390)."""

import numpy as np

from trt_spec import backend_contract as bc
from trt_spec.serving import requested_only

LIMITS = bc.EngineLimits(max_batch_size=4, max_seq_len=64, max_num_tokens=64, max_draft_len=4)


def _req(outputs, **extra):
    inputs = {"input_ids": np.asarray([[5, 6, 7]], dtype=np.int32),
              "request_output_len": np.asarray([[4]], dtype=np.int32), **extra}
    return bc.parse_request(inputs, outputs, LIMITS, {}, decoupled=True)


def test_engine_response_holds_only_requested_outputs():
    perf = {"return_perf_metrics": np.asarray([[True]])}
    lean = bc.response_tensors(_req(list(bc.MANDATORY_OUTPUTS), **perf), [8, 9], accepted=1, drafted=2)
    assert set(lean) == set(bc.MANDATORY_OUTPUTS)  # perf outputs computed but not asked for: not sent
    full = bc.response_tensors(_req([*bc.MANDATORY_OUTPUTS, *bc.PERF_OUTPUTS], **perf), [8, 9], accepted=1, drafted=2)
    assert set(full) == set(bc.MANDATORY_OUTPUTS) | set(bc.PERF_OUTPUTS)
    assert float(full["acceptance_rate"][0, 0]) == 0.5
    assert full["output_ids"].tolist() == [[[5, 6, 7, 8, 9]]]


def test_requested_only_keeps_the_requested_tensors_unchanged():
    tensors = {"text_output": np.array([[b"hi"]], dtype=object), "output_ids": np.asarray([[1, 2]]),
               "acceptance_rate": np.asarray([[0.5]], dtype=np.float32)}
    kept = requested_only(tensors, ["text_output", "not_an_output"])
    assert list(kept) == ["text_output"] and kept["text_output"] is tensors["text_output"]
    assert requested_only(tensors, []) == {}
