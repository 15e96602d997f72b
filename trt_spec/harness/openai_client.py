"""The harness's client for any OpenAI-compatible server (`trt-spec bench openai`), with LLMClient's interface.

BASELINE and SPECULATIVE map to one endpoint each. Acceptance comes from per-request `metrics.speculative_decoding`
where the server sends it (upstream-facts: vllm-per-request-spec-metrics); otherwise it is reported as missing, not 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..records import llmapi_contract as lc
from ..records.names import (
    ACCEPTED_LENGTH_HISTOGRAM,
    BASELINE,
    DRAFT_LEN_POLICY,
    NUM_DRAFT_TOKENS,
    SPECULATIVE,
    TEXT_MODELS,
    TOTAL_STEPS,
)
from ..serve.openai import metrics as om
from .client import ClientError, Generation

APIS = ("chat", "completions")
# lc.ACCEPTANCE_SOURCE values
FROM_RESPONSES = "the server's responses (metrics.speculative_decoding, vLLM's per-request shape)"
NOT_REPORTED = (
    "nowhere: not reported (the server's responses carry no metrics.speculative_decoding; vLLM sends it when "
    "started with --per-request-spec-decode-metrics summary)"
)


def response_acceptance(metrics: object) -> dict:
    """A response's `metrics` -> Generation.metrics in the harness's names; only the source when there are no counts."""
    spec = metrics.get(om.SPEC_DECODE_KEY) if isinstance(metrics, dict) else None
    note = metrics.get(om.LLMAPI_NOTE_KEY) if isinstance(metrics, dict) else None
    if isinstance(note, str) and note:  # the LLM-API model's zero counts measured nothing
        return {lc.ACCEPTANCE_SOURCE: f"nowhere: not reported ({note})"}
    counts = (spec or {}).get(om.NUM_ACCEPTED_DRAFT_TOKENS), (spec or {}).get(om.NUM_DRAFT_TOKENS)
    if not all(type(x) is int and x >= 0 for x in counts):
        return {lc.ACCEPTANCE_SOURCE: NOT_REPORTED}
    out = {
        "total_accepted_draft_tokens": counts[0],
        "total_draft_tokens": counts[1],
        lc.ACCEPTANCE_SOURCE: FROM_RESPONSES,
    }
    hist, steps = spec.get(om.ACCEPTANCE_HISTOGRAM), spec.get(om.NUM_SPEC_STEPS)
    if isinstance(hist, list) and all(type(x) is int for x in hist):
        out[ACCEPTED_LENGTH_HISTOGRAM] = hist
    if type(steps) is int:
        out[TOTAL_STEPS] = steps  # drafting steps only
    return out


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # …/v1
    model: str


def base_url(url: str) -> str:
    """[http://]HOST:PORT[/v1] -> http://HOST:PORT/v1."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def endpoints(urls: tuple[str, ...], models: tuple[str, ...]) -> dict[str, Endpoint]:
    """The two roles from --url URL [URL] and --model BASELINE SPECULATIVE."""
    if not 1 <= len(urls) <= 2:
        raise ValueError(f"--url takes one URL (both models on it) or two (baseline, speculative), got {len(urls)}")
    names = tuple(models) or TEXT_MODELS
    if len(names) != 2:
        raise ValueError(f"--model takes two names, the baseline's then the speculative one's, got {len(names)}")
    a, b = (urls[0], urls[0]) if len(urls) == 1 else urls
    return {BASELINE: Endpoint(base_url(a), names[0]), SPECULATIVE: Endpoint(base_url(b), names[1])}


class OpenAIClient:
    """LLMClient's interface over the OpenAI API; `generate` takes the role as `model`."""

    def __init__(
        self,
        roles: dict[str, Endpoint],
        *,
        api: str = "chat",
        api_key: str = "none",
        timeout_s: float = 600.0,
        tenant: str | None = None,
    ):
        """tenant: sent as `user` on every speculative request."""
        import openai

        if api not in APIS:
            raise ValueError(f"api {api!r}: use one of {', '.join(APIS)}")
        self.roles, self.api = roles, api
        self._clients = {
            role: openai.OpenAI(base_url=e.base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
            for role, e in roles.items()
        }
        self.url = " / ".join(sorted({e.base_url for e in roles.values()}))
        self.tenant = tenant

    def check_ready(self, models: list[str]) -> None:
        import openai

        for role in models:
            e = self.roles[role]
            try:
                served = {m.id for m in self._clients[role].models.list().data}
            except openai.APIError as err:
                raise ClientError(
                    f"no OpenAI-compatible server answers at {e.base_url} ({_message(err)}); start one "
                    "(trt-spec serve REPO --openai-port PORT)"
                ) from None
            if e.model not in served:
                raise ClientError(
                    f"model {e.model!r} is not served at {e.base_url} (it has: {', '.join(sorted(served))});"
                    " pass --model BASELINE --model SPECULATIVE"
                )

    def close(self) -> None:
        for c in self._clients.values():
            c.close()

    def generate(
        self, model: str, prompt: str | list[dict], max_tokens: int, *, stream: bool = True, **params
    ) -> Generation:
        """prompt: text, or a conversation's messages (chat API only)."""
        import openai

        e = self.roles[model]
        if isinstance(prompt, list) and self.api != "chat":
            raise ValueError("a conversation's messages go over the chat API only (--api chat)")
        body = {"temperature": float(params.pop("temperature", 0.0)), "max_tokens": int(max_tokens)}
        for name in ("top_p", "seed"):
            if name in params:
                body[name] = params.pop(name)
        if self.tenant and model == SPECULATIVE:
            body["user"] = self.tenant
        extra = {k: params.pop(k) for k in (NUM_DRAFT_TOKENS, DRAFT_LEN_POLICY) if k in params}
        params.pop("exclude_input_in_output", None)  # never echoed by default
        if params:
            raise ValueError(f"not expressible in the OpenAI API: {', '.join(sorted(params))}")
        client = self._clients[model]
        t0 = time.perf_counter()
        chunks: list[tuple[str, float]] = []
        tokens = None
        acceptance = response_acceptance(None)
        try:
            if self.api == "chat":
                it = client.chat.completions.create(
                    model=e.model,
                    messages=prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=extra or None,
                    **body,
                )
            else:
                it = client.completions.create(
                    model=e.model,
                    prompt=prompt,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=extra or None,
                    **body,
                )
            for c in it:
                if c.usage is not None:
                    tokens = c.usage.completion_tokens
                if (c.model_extra or {}).get("metrics") is not None:  # on the trailing usage chunk
                    acceptance = response_acceptance(c.model_extra["metrics"])
                if c.choices:
                    text = c.choices[0].delta.content if self.api == "chat" else c.choices[0].text
                    if text:
                        chunks.append((text, time.perf_counter() - t0))
        except openai.APIStatusError as err:
            raise ClientError(f"{e.model} at {e.base_url}: HTTP {err.status_code}: {_message(err)}") from None
        except openai.APIError as err:
            raise ClientError(f"{e.model} at {e.base_url}: {_message(err)}") from None
        latency = time.perf_counter() - t0
        times = [t for _, t in chunks]
        return Generation(
            text="".join(x for x, _ in chunks),
            output_ids=[],
            ttft_s=times[0] if times else latency,
            latency_s=latency,
            chunks=len(chunks),
            chunk_times_s=times,
            tokens=tokens if tokens is not None else len(chunks),
            metrics=acceptance if model == SPECULATIVE else {},
        )


def _message(err) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return str(getattr(err, "message", err))


def client_factory(roles: dict[str, Endpoint], api: str, api_key: str, tenant: str | None = None):
    return lambda: OpenAIClient(roles, api=api, api_key=api_key, tenant=tenant)
