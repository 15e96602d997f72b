"""The OpenAI frontend's request checks and text handling, without a server (tests/e2e/test_openai.py runs it)."""

from __future__ import annotations

import numpy as np
import pytest

from trt_spec.in_triton.serving import StopCutter
from trt_spec.records.names import BASELINE, SPECULATIVE
from trt_spec.serve.openai.requests import FrontendSettings, OpenAIError, parse_request, request_tensors

S = FrontendSettings("127.0.0.1:8001", "tok", max_seq_len=64, max_draft_len=4)


class Tok:
    """One token per character; a chat template that joins the turns."""

    chat_template = "x"

    def __len__(self):  # 4 tokens of at most 2 bytes: prompts over 64 x 2 x NORMALIZATION_SLACK bytes are refused
        return 4

    def decode(self, ids):
        return "ab"

    def encode(self, text, add_special_tokens=True):
        return [1] * (len(text) + (1 if add_special_tokens else 0))

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        turns = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


def parse(chat=False, **body):
    return parse_request({"model": SPECULATIVE, **({} if chat else {"prompt": "hello"}), **body}, Tok(), S, chat=chat)


def test_openai_defaults():
    r = parse()
    assert (r.max_tokens, r.temperature, r.top_p, r.stream, r.stop) == (16, 1.0, 1.0, False, [])  # OpenAI: sampling
    assert r.prompt_tokens == 6
    greedy = parse(temperature=0)
    assert greedy.temperature is None and greedy.top_p is None  # greedy: no sampling input at all
    t = request_tensors(greedy)
    assert "temperature" not in t and "top_p" not in t and t["max_tokens"].tolist() == [[16]]
    assert t["exclude_input_in_output"].tolist() == [[True]]
    chat = parse(chat=True, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert chat.text == "<user>hi<assistant>" and chat.max_tokens == 64 - chat.prompt_tokens - 4  # the room left
    sampled = request_tensors(parse(temperature=0.7, seed=3, stop="\n", num_draft_tokens=2, draft_len_policy="fixed"))
    assert sampled["top_p"].tolist() == [[1.0]] and sampled["seed"].dtype == np.uint64
    assert sampled["stop_words"].tolist() == [[b"\n"]] and sampled["num_draft_tokens"].tolist() == [[2]]


@pytest.mark.parametrize(
    "body,status,words",
    [
        ({"model": "gpt-4"}, 404, "does not exist"),
        ({"n": 3}, 400, "'n' must be 1"),
        ({"max_tokens": 0}, 400, "'max_tokens' must be in [1"),
        ({"max_tokens": 55}, 400, "ask for at most 54"),
        ({"max_tokens": 60}, 400, "'max_tokens' 60 exceeds this deployment's context (64 tokens, less max_draft_len 4"),
        ({"temperature": float("nan")}, 400, "'temperature' must be a number"),
        ({"metadata": {"k": 1}}, 400, "'metadata' keys must be at most 64 characters and its values strings"),
        ({"max_tokens": "8"}, 400, "'max_tokens' must be an integer"),
        ({"temperature": -1}, 400, "'temperature' must be in [0"),
        ({"top_p": 0}, 400, "'top_p' must be in (0"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "up to 4"),
        ({"stream_options": {"include_usage": True}}, 400, "only allowed with stream"),
        ({"num_draft_tokens": 5}, 400, "'num_draft_tokens' must be in [0, 4]"),
        ({"model": BASELINE, "draft_len_policy": "fixed"}, 400, "applies to the speculative model"),
        ({"echo": True}, 400, "'echo' is not supported"),
        ({"frobnicate": 1}, 400, "unrecognized request argument: 'frobnicate'"),
        ({"prompt": ["a", "b"]}, 400, "one prompt per request"),
        ({"prompt": ""}, 400, "the prompt is empty"),
        ({"prompt": "x" * 600}, 400, "the prompt is 600 bytes: more than any text of at most 64 tokens can be (512"),
        ({"prompt": "hi", "stop": "y" * 600}, 400, "'stop' is longer than any text of at most 64 tokens"),
    ],
)
def test_bad_requests_name_the_field(body, status, words):
    with pytest.raises(OpenAIError) as e:
        parse(**body)
    assert e.value.status == status and words in e.value.message
    assert e.value.body()["error"]["message"] == e.value.message


def test_harmless_fields_are_accepted():
    assert parse(user="u1", logprobs=None, presence_penalty=0, n=1).model == SPECULATIVE


def test_stop_cutter_never_hands_out_a_stop_string_or_what_follows():
    c = StopCutter(["END", "\n\n"])
    out = [c.add(x) for x in ("ab", "cE", "N", "D tail")]
    assert "".join(out) == "abc" and c.stopped and c.flush() == ""
    c = StopCutter(["END"])
    assert c.add("abcE") == "ab"  # the last two characters could still begin "END": held back
    assert c.add("x") == "c" and c.flush() == "Ex" and not c.stopped
    c = StopCutter([])
    assert c.add("abc") == "abc" and c.flush() == ""


def test_user_is_the_speculative_models_tenant():
    """OpenAI's `user` scopes the BLS's cross-request suffix cache (its `tenant` input); the baseline ensemble declares
    no such input, so it is never sent there."""
    assert request_tensors(parse(user="team-a"))["tenant"].tolist() == [[b"team-a"]]
    assert "tenant" not in request_tensors(parse())
    assert "tenant" not in request_tensors(parse(user=""))  # empty: no tenant (no cache under scope tenant)
    assert "tenant" not in request_tensors(parse(model=BASELINE, user="team-a"))
    with pytest.raises(OpenAIError, match="'user' must be a string"):
        parse(user=7)
    with pytest.raises(OpenAIError, match="longer than 256 bytes"):
        parse(user="x" * 257)


def test_acceptance_in_vllms_shape_from_the_bls_outputs_and_read_back_by_bench():
    """serve/openai_metrics.speculative_decoding builds vLLM's metrics.speculative_decoding from the BLS's outputs, with
    the identities AIPerf's vLLM adapter checks; harness/openai_client.response_acceptance reads it (or vLLM's own
    documented example) back into the harness's names, and a response without it as "not reported"."""
    from trt_spec.harness.openai_client import FROM_RESPONSES, NOT_REPORTED, response_acceptance
    from trt_spec.records import llmapi_contract as lc
    from trt_spec.serve.openai.metrics import speculative_decoding

    bls = {"total_accepted_draft_tokens": 12, "total_draft_tokens": 28, "total_steps": 15}
    spec = speculative_decoding({**bls, "accepted_length_histogram": [4, 6, 1, 0, 1], "draft_lengths": [4] * 15})
    assert spec == {
        "mean_acceptance_length": 2.0,  # 1 + 12 / 12 rounds that drafted (not the 15 rounds in all)
        "draft_acceptance_rate": 12 / 28,
        "num_accepted_draft_tokens": 12,
        "num_draft_tokens": 28,
        "acceptance_histogram": [4, 6, 1, 0, 1],
        "num_spec_steps": 12,
        "num_spec_tokens": 4,
    }
    zero = speculative_decoding(
        {**bls, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0, "accepted_length_histogram": [0]}
    )
    assert (zero["mean_acceptance_length"], zero["draft_acceptance_rate"], zero["num_spec_steps"]) == (1.0, 0.0, 0)
    # in-engine modes: the engine's two totals only; no histogram and no verify-step count are made up
    assert speculative_decoding({**bls, "accepted_length_histogram": []}) == {
        "draft_acceptance_rate": 12 / 28,
        "num_accepted_draft_tokens": 12,
        "num_draft_tokens": 28,
    }
    assert speculative_decoding({}) is None  # cut before the final response
    got = response_acceptance({"speculative_decoding": spec})
    assert got == {
        "total_accepted_draft_tokens": 12,
        "total_draft_tokens": 28,
        "accepted_length_histogram": [4, 6, 1, 0, 1],
        "total_steps": 12,
        lc.ACCEPTANCE_SOURCE: FROM_RESPONSES,
    }
    vllm_doc = {  # vLLM docs/features/speculative_decoding/acceptance_metrics.md's example
        "mean_acceptance_length": 1.2325581395348837,
        "draft_acceptance_rate": 0.07751937984496124,
        "acceptance_histogram": [39, 1, 0, 3],
        "num_spec_steps": 43,
        "num_accepted_draft_tokens": 10,
        "num_draft_tokens": 129,
        "num_spec_tokens": 3,
    }
    assert response_acceptance({"speculative_decoding": vllm_doc})["total_steps"] == 43
    for absent in (None, {}, {"speculative_decoding": None}, {"speculative_decoding": {"num_draft_tokens": "9"}}):
        assert response_acceptance(absent) == {lc.ACCEPTANCE_SOURCE: NOT_REPORTED}


def test_bench_openai_does_not_take_llmapi_zero_counts_for_a_measurement():
    """Over the LLM-API model (TensorRT-LLM 1.2.1) trt-spec's frontend sends the model's zero counts with a note
    beside them: bench openai reports acceptance as not reported, naming why, never a 0% rate."""
    from trt_spec.harness.openai_client import response_acceptance
    from trt_spec.records import llmapi_contract as lc
    from trt_spec.serve.openai.metrics import LLMAPI_NOTE_KEY, LLMAPI_ZERO_NOTE, SPEC_DECODE_KEY

    zeros = {"num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "draft_acceptance_rate": 0.0}
    got = response_acceptance({SPEC_DECODE_KEY: zeros, LLMAPI_NOTE_KEY: LLMAPI_ZERO_NOTE})
    assert set(got) == {lc.ACCEPTANCE_SOURCE} and LLMAPI_ZERO_NOTE in got[lc.ACCEPTANCE_SOURCE]
    assert got[lc.ACCEPTANCE_SOURCE].startswith("nowhere: not reported")
    assert response_acceptance({SPEC_DECODE_KEY: zeros})["total_draft_tokens"] == 0  # without the note: the counts
