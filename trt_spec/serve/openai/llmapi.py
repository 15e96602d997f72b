"""The OpenAI frontend over a `runtime: llmapi` repository (TensorRT-LLM's LLM-API model, text in and text out):
the request's tensors, and the model's whole-text responses as OpenAI deltas, token counts and finish reasons.

Stop strings are cut here, never sent (upstream-facts: llmapi-stop-input-broken). The model returns no token ids,
so completion_tokens comes from re-tokenizing the final text.
"""

from __future__ import annotations

import numpy as np

from ...in_triton.serving import StopCutter
from ...records import llmapi_contract as lc
from .requests import FrontendSettings, GenRequest

# the model's values that OpenAI also has (upstream-facts: llmapi-finish-reason-values)
FINISH_REASONS = ("stop", "length")


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
    if r.temperature is not None:  # greedy sends none (upstream-facts: llmapi-greedy-sampling-params)
        t[lc.SAMPLING_PREFIX + "temperature"] = one(r.temperature, np.float32)
        t[lc.SAMPLING_PREFIX + "top_p"] = one(r.top_p if r.top_p is not None else 1.0, np.float32)
    if r.seed is not None:
        t[lc.SAMPLING_PREFIX + "seed"] = one(r.seed, np.uint64)
    return t


class TextDeltas:
    """The model's whole-text-so-far responses as text deltas, stop strings cut.

    A response that does not extend the last one (upstream-facts: llmapi-final-text-drops-stop) is cut again from
    its start; if it does not begin with what was already sent, nothing more is sent."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.cut = StopCutter(stops)
        self.seen = ""
        self.passed = ""  # prefix of seen
        self.sent = ""  # prefix of passed
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
    """max_tokens when it ended for length, else the re-tokenized count capped at max_tokens (re-tokenizing need not
    give back the decoded ids)."""
    return r.max_tokens if reason == "length" else min(retokenized, r.max_tokens)
