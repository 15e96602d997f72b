"""A strict in-memory double of a `tensorrt_llm` model: every request goes through the same contract checks the
CPU stand-in runs (trt_spec/records/backend_contract.py), so the speculative loop is tested against the backend's
rules without a server. The "model" is a deterministic next-token function over integer tokens."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from trt_spec.in_triton.speculative_loop import EngineError
from trt_spec.records import backend_contract as bc

VOCAB = 50
END_ID = 2


def target_next(seq: list[int]) -> int:
    """The target's greedy choice after `seq` (cycles through a few phrases; EOS after long outputs)."""
    if len(seq) > 120:
        return END_ID
    return (seq[-1] * 7 + len(seq) // 3) % (VOCAB - 3) + 3


def draft_next(seq: list[int]) -> int:
    """A draft that agrees with the target except at every fourth position."""
    t = target_next(seq)
    return t if len(seq) % 4 else (t + 1) % VOCAB


class ContractEngine:
    """One engine model. `in_engine_accept`: an engine that drafts by itself (Medusa-like), accepting that many
    tokens per step."""

    def __init__(
        self,
        next_token: Callable[[list[int]], int],
        limits: bc.EngineLimits,
        *,
        decoupled: bool = True,
        params: Optional[dict] = None,
        in_engine_accept: int = 0,
    ):
        self.next_token = next_token
        self.limits = limits
        self.decoupled = decoupled
        self.params = params or {}
        self.in_engine_accept = in_engine_accept
        self.declared = [t.name for t in bc.OUTPUTS]  # the outputs trt-spec's engine configs declare
        self.requests: list[tuple[dict, list[str]]] = []

    def _continue(self, req: bc.EngineRequest, seq: list[int], n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            t = self.next_token(seq + out)
            if t == req.end_id:  # finished; the end token is not output (backend_contract.EOS_EXCLUDED)
                break
            out.append(t)
            if any(out[-len(w) :] == w for w in req.stop_words):
                break
        return out

    def __call__(self, inputs: dict, outputs: list[str]) -> list[dict[str, np.ndarray]]:
        self.requests.append((inputs, list(outputs)))
        req = bc.parse_request(inputs, outputs, self.limits, self.params, decoupled=self.decoupled)
        if not req.greedy:
            raise AssertionError("the double decodes greedily only; the loop sent sampling it should not have")
        if req.draft_tokens:  # one verification step: accepted prefix + the target's own token
            seq, acc = list(req.input_ids), 0
            for d in req.draft_tokens[: req.output_len - 1]:
                if self.next_token(seq) != d:
                    break
                seq.append(d)
                acc += 1
            new = req.draft_tokens[:acc] + [self.next_token(seq)]
            if req.end_id in new:
                new = new[: new.index(req.end_id)]
            perf = bc.PerfOutputs(accepted=min(acc, len(new)), drafted=len(req.draft_tokens))
            return [bc.response_tensors(req, new, perf=perf, declared=self.declared)]
        tokens = self._continue(req, list(req.input_ids), req.output_len)
        if not req.streaming:
            drafted = accepted = 0
            if self.in_engine_accept:
                steps = -(-len(tokens) // (self.in_engine_accept + 1))
                drafted, accepted = steps * self.in_engine_accept, len(tokens) - steps
            return [
                bc.response_tensors(
                    req, tokens, perf=bc.PerfOutputs(accepted=accepted, drafted=drafted), declared=self.declared
                )
            ]
        step = self.in_engine_accept + 1
        chunks = [tokens[i : i + step] for i in range(0, len(tokens), step)]
        out, done = [], 0
        for c in chunks:
            done += len(c)
            steps = len(out) + 1
            out.append(
                bc.response_tensors(
                    req,
                    c,
                    perf=bc.PerfOutputs(accepted=done - steps, drafted=steps * self.in_engine_accept),
                    declared=self.declared,
                )
            )
        return out


class Router:
    """The EngineCall the loop gets: model name -> ContractEngine; contract violations become EngineError, as the
    BLS adapter turns the backend's error responses into EngineError."""

    def __init__(self, **engines: ContractEngine):
        self.engines = engines

    async def __call__(self, model, inputs, outputs, on_response=None):
        try:
            responses = self.engines[model](inputs, list(outputs))
        except bc.ContractError as e:
            raise EngineError(str(e)) from None
        for r in responses:
            if on_response is not None:
                on_response(r)
        return responses
