"""The OpenAI frontend over a `runtime: llmapi` repository, without a server: the settings model.yaml gives, the
LLM-API model's request, its whole-text answers as deltas, and the acceptance it returns (tests/e2e/test_llmapi_cpu.py
serves it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from trt_spec.records import llmapi_contract as lc
from trt_spec.repository.writer import RepositoryError
from trt_spec.serve.launch import ServedRepository
from trt_spec.serve.openai.frontend import Completion, _with_metrics
from trt_spec.serve.openai.llmapi import TextDeltas, completion_tokens, finish_reason, llmapi_tensors
from trt_spec.serve.openai.metrics import LLMAPI_NOTE_KEY, LLMAPI_ZERO_NOTE, llmapi_speculative_decoding
from trt_spec.serve.openai.requests import FrontendSettings, OpenAIError, parse_request

from .test_openai_frontend import Tok


def write_repo(root, spec: dict | None = None, model: str | None = None, baseline: bool = True):
    target = root / "target"
    target.mkdir(exist_ok=True)
    y = {
        "model": model or str(target),
        "backend": "pytorch",
        "max_seq_len": 64,
        "max_num_tokens": 48,
        **({"speculative_config": spec} if spec is not None else {}),
        "triton_config": {"max_batch_size": 0, "decoupled": True, "cancellation_check_period_ms": 100},
    }
    for name in (lc.MODEL_NAME, *([lc.BASELINE_MODEL] if baseline else [])):
        (root / "repo" / name / "1").mkdir(parents=True, exist_ok=True)
        (root / "repo" / name / "1" / lc.YAML_FILE).write_text(yaml.safe_dump(y))
    return root / "repo"


def _unrecorded(repo):
    """A repository as serve reads one without trt-spec's record (read for what it holds)."""
    return ServedRepository(Path(repo), None)


def test_settings_from_model_yaml(tmp_path):
    s = FrontendSettings.from_repository(
        _unrecorded(write_repo(tmp_path, {"decoding_type": "NGram", "max_draft_len": 4})), "h:1"
    )
    assert s.llmapi and s.models == (lc.MODEL_NAME,) and s.phase_models == (lc.BASELINE_MODEL,)
    assert (s.tokenizer_dir, s.max_seq_len, s.max_draft_len) == (str(tmp_path / "target"), 64, 4)
    assert s.prompt_limit == 48 and s.add_special_tokens and s.decoupled and s.speculative_config
    mtp = FrontendSettings.from_repository(
        _unrecorded(write_repo(tmp_path, {"decoding_type": "MTP", lc.NUM_NEXTN: 3})), "h:1"
    )
    assert mtp.max_draft_len == 3  # MTPDecodingConfig's max_draft_len is num_nextn_predict_layers
    plain = FrontendSettings.from_repository(_unrecorded(write_repo(tmp_path, None)), "h:1")
    assert not plain.speculative_config and plain.max_draft_len == 0


def test_settings_refusals_are_one_line(tmp_path):
    with pytest.raises(RepositoryError, match="is not a directory on this machine"):
        FrontendSettings.from_repository(_unrecorded(write_repo(tmp_path, None, model=str(tmp_path / "gone"))), "h:1")
    (tmp_path / "repo" / lc.MODEL_NAME / "1" / lc.YAML_FILE).write_text("model: [")
    with pytest.raises(RepositoryError, match="not a model.yaml the OpenAI frontend can read"):
        FrontendSettings.from_repository(_unrecorded(tmp_path / "repo"), "h:1")
    with pytest.raises(RepositoryError, match="neither tensorrt_llm_bls/config.pbtxt nor tensorrt_llm/1/model.yaml"):
        FrontendSettings.from_repository(_unrecorded(tmp_path), "h:1")


S = FrontendSettings(
    "h:1",
    "tok",
    64,
    4,
    True,
    models=(lc.MODEL_NAME,),
    max_input_len=48,
    runtime="llmapi",
    phase_models=(lc.BASELINE_MODEL,),
)


def parse(chat=False, **body):
    return parse_request({"model": lc.MODEL_NAME, **({} if chat else {"prompt": "hello"}), **body}, Tok(), S, chat=chat)


def test_the_llmapi_request():
    greedy = llmapi_tensors(parse(temperature=0, max_tokens=8), S)
    assert set(greedy) == {
        "text_input",
        "streaming",
        "sampling_param_max_tokens",
        "sampling_param_exclude_input_from_output",
        "sampling_param_return_perf_metrics",
        "return_finish_reason",
    }  # greedy: no sampling input (SamplingParams' greedy: top_k and top_p unset)
    assert greedy["text_input"].tolist() == [b"hello"] and greedy["streaming"].tolist() == [True]
    assert greedy["sampling_param_max_tokens"].dtype == np.int32 and all(a.shape == (1,) for a in greedy.values())
    sampled = llmapi_tensors(parse(temperature=0.5, seed=3, stop=["\n", "x"], user="u"), S)
    assert sampled["sampling_param_temperature"].tolist() == [0.5] and sampled["sampling_param_top_p"].tolist() == [1.0]
    assert sampled["sampling_param_seed"].dtype == np.uint64
    assert lc.STOP_INPUT not in sampled  # NVIDIA's model cannot take stop strings: the frontend cuts them itself
    assert parse(user="u").tenant is None  # the LLM-API model has no tenant: `user` is ignored
    unstreamed = FrontendSettings(**{**S.__dict__, "decoupled": False})
    assert llmapi_tensors(parse(), unstreamed)["streaming"].tolist() == [False]


@pytest.mark.parametrize(
    "body,status,param,words",
    [
        ({"num_draft_tokens": 2}, 400, "num_draft_tokens", "model.yaml's speculative_config"),
        ({"draft_len_policy": "fixed"}, 400, "draft_len_policy", "omit it"),
        ({"model": lc.BASELINE_MODEL}, 404, "model", "loaded only for the baseline phase of `trt-spec check`"),
        ({"model": "tensorrt_llm_bls"}, 404, "model", "this server has tensorrt_llm"),
        ({"max_tokens": 55}, 400, "max_tokens", "ask for at most 54"),
    ],
)
def test_llmapi_refusals_name_the_field(body, status, param, words):
    with pytest.raises(OpenAIError) as e:
        parse(**body)
    assert (e.value.status, e.value.param) == (status, param) and words in e.value.message


def test_whole_texts_become_deltas_with_stop_strings_cut():
    d = TextDeltas([])
    assert [d.add(t) for t in ("a", "ab", "ab", "abcd")] + [d.flush()] == ["a", "b", "", "cd", ""]
    d = TextDeltas(["END"])
    out = [d.add(t) for t in ("x = 1", "x = 1\nE", "x = 1\nEN")]
    assert "".join(out) == "x = 1\n" and not d.stopped  # "EN" held back: it may become the stop string
    # the model matched the stop string and dropped it from its final text: what it took back was never handed out
    assert d.add("x = 1\n") == "" and not d.stopped and d.flush() == "" and d.sent == "x = 1\n"
    d = TextDeltas(["END"])
    assert d.add("a EN") == "a " and d.add("a E") == "" and d.add("a EF") == "" and d.flush() == "EF"
    assert d.sent == "a EF"  # cut again from the start: nothing handed out twice
    d = TextDeltas(["END"])
    assert d.add("abENDcd") == "ab" and d.stopped and d.add("abENDcdef") == "" and d.flush() == ""
    d = TextDeltas([])
    assert d.add("abc") == "abc" and d.add("xy") == "" and d.stopped  # text taken back that was handed out: stop


def test_finish_reason_is_the_models_where_it_is_openais():
    r = parse(max_tokens=4)
    assert finish_reason(b"length", 2, r, False) == "length"  # the model's word, not a count of re-tokenized text
    assert finish_reason(b"None", 4, r, False) == "length" and finish_reason(None, 2, r, False) == "stop"
    assert finish_reason(b"length", 4, r, True) == "stop"  # the frontend cut a stop string
    # tokens: exactly max_tokens for length; else the re-tokenized text, never above max_tokens
    assert (completion_tokens(2, "length", r), completion_tokens(9, "stop", r), completion_tokens(3, "stop", r)) == (
        4,
        4,
        3,
    )


def test_acceptance_as_the_model_returned_it():
    zeros = {"total_accepted_draft_tokens": b"0", "total_draft_tokens": b"0", "acceptance_rate": b"0.0"}
    spec, note = llmapi_speculative_decoding(zeros)
    assert spec == {"draft_acceptance_rate": 0.0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0}
    assert note == LLMAPI_ZERO_NOTE
    filled = {"total_accepted_draft_tokens": b"5", "total_draft_tokens": b"8", "acceptance_rate": b"0.625"}
    assert llmapi_speculative_decoding(filled) == (
        {"draft_acceptance_rate": 0.625, "num_accepted_draft_tokens": 5, "num_draft_tokens": 8},
        None,
    )
    assert llmapi_speculative_decoding({**filled, "acceptance_rate": b"nan"})[0]["draft_acceptance_rate"] == 0.625
    assert llmapi_speculative_decoding({}) == (None, None)  # nothing returned: nothing reported
    body = _with_metrics({"id": "x"}, Completion(spec=spec, note=note))
    assert body["metrics"] == {"speculative_decoding": spec, LLMAPI_NOTE_KEY: LLMAPI_ZERO_NOTE}
    assert _with_metrics({"id": "x"}, Completion()) == {"id": "x"}


def test_aiperf_shows_no_spec_decode_section_for_it():
    """AIPerf 0.13's vLLM adapter claims a payload only with acceptance_histogram and num_spec_steps: the LLM-API
    model reports neither, so AIPerf shows nothing rather than numbers trt-spec would have to invent."""
    adapter = pytest.importorskip("aiperf.spec_decode.vllm_adapter")
    spec, _ = llmapi_speculative_decoding({"total_accepted_draft_tokens": "0", "total_draft_tokens": "0"})
    assert not adapter._is_vllm_payload(spec)
