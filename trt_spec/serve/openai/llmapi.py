"""The OpenAI frontend over a `runtime: llmapi` repository: TensorRT-LLM's LLM-API model `tensorrt_llm`
(records/llmapi_contract.py), text in and text out. What a request becomes, and how its answers become OpenAI's.

The request: text_input (the prompt, or the chat rendered with the tokenizer's template, as the engine path sends
it), `streaming` whenever the model is decoupled (one call, one response per iteration, as the engine path's calls),
sampling_param_max_tokens, exclude_input_from_output (the completion only), return_perf_metrics and
return_finish_reason. Never sampling_param_stop: NVIDIA's model cannot pass it on (lc.STOP_INPUT); stop strings are
cut here from the text and the call ended, as the engine path ends its call at a text stop. Sampling as NVIDIA's
helpers.py get_sampling_params_from_request reads it (each sampling_param_X is SamplingParams' X; MODEL =
triton_backend/all_models/llmapi/tensorrt_llm/1, lc): greedy sends no sampling input — SamplingParams' greedy is
top_k and top_p unset, whatever the temperature (tensorrt_llm/sampling_params.py @ 000a01de `_greedy_decoding`) —;
sampling sends the temperature and top_p (1 when the request has none, OpenAI's default), as the engine path does;
seed as sampling_param_seed.

The answers: each response's text_output is the whole text so far (MODEL sends CompletionOutput.text), turned into
deltas here (TextDeltas), through the same StopCutter as the engine path, so the text never holds a stop string.
The model returns no token ids: completion_tokens is max_tokens when the generation ended for length, else the final
text re-tokenized with the target's tokenizer (at most max_tokens).
finish_reason is the model's (its finish_reason output, on the final response) where it is OpenAI's "stop" or
"length"; else, and when the frontend's own cut ended the call, as the engine path decides it.
"""

from __future__ import annotations

import numpy as np

from ...in_triton.serving import StopCutter
from ...records import llmapi_contract as lc
from .requests import FrontendSettings, GenRequest

FINISH_REASONS = ("stop", "length")  # the model's finish_reason values that are OpenAI's (MODEL: also timeout, ...)


def llmapi_tensors(r: GenRequest, s: FrontendSettings) -> dict[str, np.ndarray]:
    """The LLM-API model's inputs for one request (max_batch_size 0: no batch dimension, each input [1])."""

    def one(value, dtype) -> np.ndarray:
        return np.array([value], dtype=dtype)

    t: dict[str, np.ndarray] = {
        lc.TEXT_INPUT: one(r.text.encode("utf-8"), object),
        lc.STREAMING: one(s.decoupled, bool),
        lc.MAX_TOKENS: one(r.max_tokens, np.int32),
        lc.EXCLUDE_INPUT: one(True, bool),
        lc.RETURN_PERF: one(True, bool),
        "return_finish_reason": one(True, bool),
    }
    if r.temperature is not None:  # sampling; greedy: none of these (SamplingParams' greedy)
        t[lc.SAMPLING_PREFIX + "temperature"] = one(r.temperature, np.float32)
        t[lc.SAMPLING_PREFIX + "top_p"] = one(r.top_p if r.top_p is not None else 1.0, np.float32)
    if r.seed is not None:
        t[lc.SAMPLING_PREFIX + "seed"] = one(r.seed, np.uint64)
    return t


class TextDeltas:
    """The model's whole-text-so-far responses as text deltas, stop strings cut (StopCutter). A response that is not
    an extension of the last one (the LLM API drops a stop string it matched from its final text, and an earlier
    response may hold its beginning, which the cutter held back) is cut again from its start, and only what goes
    beyond the text already handed out is handed out. If it does not begin with that text, nothing more is."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.cut = StopCutter(stops)
        self.seen = ""  # the model's latest whole text
        self.passed = ""  # what the cutter let through of it (a prefix of it)
        self.sent = ""  # what was handed out (a prefix of passed)
        self.diverged = False

    @property
    def stopped(self) -> bool:
        return self.cut.stopped or self.diverged

    def add(self, whole: str) -> str:
        if self.stopped:
            return ""
        if whole.startswith(self.seen):
            self.passed += self.cut.add(whole[len(self.seen) :])
        elif whole.startswith(self.sent):
            self.cut = StopCutter(self.stops)
            self.passed = self.cut.add(whole)
        else:
            self.diverged = True
            return ""
        self.seen = whole
        return self._out()

    def flush(self) -> str:
        if not self.stopped:
            self.passed += self.cut.flush()
        return self._out()

    def _out(self) -> str:
        out = self.passed[len(self.sent) :]
        self.sent += out
        return out


def finish_reason(model_says, tokens: int, r: GenRequest, cut: bool) -> str:
    """The model's finish_reason where it is OpenAI's, else length/stop as the engine path decides them."""
    said = model_says.decode("utf-8", errors="replace") if isinstance(model_says, bytes) else model_says
    if not cut and said in FINISH_REASONS:
        return said
    return "length" if tokens >= r.max_tokens and not cut else "stop"


def completion_tokens(retokenized: int, reason: str, r: GenRequest) -> int:
    """The completion's tokens: max_tokens when it ended for length (the model generated exactly that many), else
    the final text re-tokenized, at most max_tokens (a text re-tokenized need not give back the ids it was decoded
    from, e.g. bytes of a broken UTF-8 sequence)."""
    return r.max_tokens if reason == "length" else min(retokenized, r.max_tokens)
