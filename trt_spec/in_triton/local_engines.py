"""The speculative loop's EngineCall over in-process stand-ins, without Triton (`bench in-process`, the LLM-API
stand-in). Refusals Triton core or the backend would make become EngineError "<model>: <message>"."""

from __future__ import annotations

import asyncio

from ..records import backend_contract as bc
from .speculative_loop import EngineError


class LocalEngines:
    """model name -> StandIn, called as the BLS calls engine models."""

    def __init__(self, standins: dict):
        self.standins = standins

    async def __call__(self, model, inputs, outputs, on_response=None):
        from ..reference.batching import QueueFullError
        from ..reference.standin import INPUT_NAMES

        s = self.standins.get(model)
        if s is None:
            raise EngineError(f"Request for unknown model: '{model}' is not found")
        unknown = sorted(set(inputs) - set(INPUT_NAMES))
        if unknown:
            raise EngineError(f"{model}: unexpected inference input '{unknown[0]}' for model '{model}'")
        loop = asyncio.get_running_loop()
        streamed: asyncio.Queue = asyncio.Queue()
        responses = []
        try:
            req = s.parse(inputs, outputs)
            # streamed: the engine thread hands one response per step to the event loop
            held: list = []

            def on_tokens(tokens: list[int]) -> None:
                progress = held[0].progress if held else None
                loop.call_soon_threadsafe(streamed.put_nowait, s.response(req, tokens, progress))

            handle = s.submit(req, on_tokens if req.streaming and not req.draft_tokens else None)
            held.append(handle)
            done = asyncio.wrap_future(handle.future)
            while True:
                getter = asyncio.ensure_future(streamed.get())
                finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter in finished:
                    out = getter.result()
                    responses.append(out)
                    if on_response is not None:
                        on_response(out)
                    continue
                getter.cancel()
                break
            res = done.result()
            while not streamed.empty():  # tokens queued before the handle resolved
                out = streamed.get_nowait()
                responses.append(out)
                if on_response is not None:
                    on_response(out)
            final = s.final(req, res)
        except (bc.ContractError, QueueFullError, ValueError) as e:
            raise EngineError(f"{model}: {e}") from None
        if final is not None:
            responses.append(final)
            if on_response is not None:
                on_response(final)
        return responses

    def close(self) -> None:
        for s in self.standins.values():
            s.close(timeout=5.0)
