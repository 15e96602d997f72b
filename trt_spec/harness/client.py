"""A Triton client for the text-in/text-out models over HTTP and gRPC, streaming or not.

Decoupled models need gRPC's bidirectional stream API (even unstreamed) or HTTP /generate(_stream). A call returns
text, output_ids, TTFT (first response carrying tokens), latency and the BLS's request metrics.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..errors import TrtSpecError
from ..records import backend_contract as bc
from ..records import llmapi_contract as lc
from ..records.defaults import LOADING_WAIT_S, PROTOCOLS
from ..records.names import (
    BASELINE,
    BASELINE_ENGINE,
    DRAFT_LEN_POLICY,
    ENGINE_MODELS,
    ENSEMBLE,
    LIST_METRICS,
    LOCAL_HOSTS,
    MAX_TOKENS,
    METRIC_OUTPUTS,
    NUM_DRAFT_TOKENS,
    OUTPUT_IDS,
    RETURN_PROFILE,
    SPECULATIVE,
    STOP_WORDS,
    STREAM,
    TARGET,
    TENANT,
    TEXT_INPUT,
    TEXT_MODELS,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    TOTAL_STEPS,
    USE_DRAFT_LOGITS,
)


class ClientError(TrtSpecError, RuntimeError):
    """Server down, unknown model or a request error: one clear line."""


@dataclass
class Generation:
    text: str
    output_ids: list[int]
    ttft_s: float
    latency_s: float
    chunks: int
    chunk_times_s: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    tokens: Optional[int] = None  # server's count when it returns no ids

    @property
    def num_tokens(self) -> int:
        return self.tokens if self.tokens is not None else len(self.output_ids)


# JSON names == tensor names; numpy dtypes for gRPC.
FIELD_TYPES = {
    MAX_TOKENS: np.int32,
    TOP_K: np.int32,
    NUM_DRAFT_TOKENS: np.int32,
    bc.END_ID: np.int32,
    bc.PAD_ID: np.int32,
    bc.TEMPERATURE: np.float32,
    TOP_P: np.float32,
    bc.SEED: np.uint64,
    STREAM: np.bool_,
    bc.EXCLUDE_INPUT_IN_OUTPUT: np.bool_,
    bc.RETURN_PERF_METRICS: np.bool_,
    USE_DRAFT_LOGITS: np.bool_,
    RETURN_PROFILE: np.bool_,
}
LLMAPI_TYPES = {
    t.name: {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32, "TYPE_UINT64": np.uint64}.get(
        t.dtype, np.int32
    )
    for t in lc.INPUTS
}
# Greedy = no top_k, top_p or temperature; temperature 0 would scale logits by 1e6 (backend_contract.FP16_LOGITS).
GREEDY: dict = {"exclude_input_in_output": True}
REQUEST_TIMEOUT_S = 600.0  # longest wait for one response (a 70B first token under load)


# Triton's refusal of a restricted API without the key (upstream-facts: triton-restricted-api-refusal)
RESTRICTED_REFUSAL = "is restricted, expecting header"


def served_admin_key(url: str) -> Optional[str]:
    """The admin key `trt-spec serve` left for url's port when url names this host, else None."""
    from ..serve.admin_key import admin_key_path

    host, _, port = url.replace("http://", "").rstrip("/").rpartition(":")
    if (
        not port.isdigit()
        or host not in {*LOCAL_HOSTS, socket.gethostname(), socket.getfqdn()}
        and not host.startswith("127.")
    ):
        return None
    try:
        key = admin_key_path(int(port)).read_text().strip()
    except OSError:
        return None
    return key or None


def read_key_file(path: str) -> str:
    """The key in an --admin-key-file; raises ClientError."""
    try:
        key = Path(path).read_text().strip()
    except OSError as e:
        raise ClientError(
            f"--admin-key-file {path}: {e.strerror}; give the file `trt-spec serve --admin-key-file` was started with"
        ) from None
    if not key:
        raise ClientError(
            f"--admin-key-file {path} is empty; give the file `trt-spec serve --admin-key-file` was started with"
        )
    return key


class LLMClient:
    def __init__(
        self, url: str, protocol: str = "grpc", timeout_s: Optional[float] = None, admin_key: Optional[str] = None
    ):
        """timeout_s: longest wait per response, then ClientError. admin_key: None = the one serve left locally."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")
        self.url = url.replace("http://", "").rstrip("/")
        self.protocol = protocol
        self.timeout = timeout_s if timeout_s is not None else REQUEST_TIMEOUT_S
        self.admin_key = admin_key
        self._grpc = None
        # runtime llmapi: the roles are two LLM-API models (records/llmapi_contract.py)
        self.llmapi = False
        self.names = {BASELINE: BASELINE, SPECULATIVE: SPECULATIVE}  # role -> model
        self.tokenizer = None  # tokenizes LLM-API text (it returns no ids)
        self.phased = False  # baseline loaded for its phase only (harness/phases.py)
        self.tenant: Optional[str] = None  # sent with every speculative request
        self._vocab: dict[str, int] = {}  # engine model -> logits row length (HTTP sends logits as one flat list)

    def use_tokenizer(self, tokenizer) -> "LLMClient":
        self.tokenizer = tokenizer
        return self

    def clone(self) -> "LLMClient":
        """A new client (own connection) to the same resolved models."""
        c = LLMClient(self.url, self.protocol, self.timeout, self.admin_key)
        c.llmapi, c.names, c.tokenizer, c.phased = self.llmapi, dict(self.names), self.tokenizer, self.phased
        c.tenant = self.tenant
        return c

    def check_ready(self, models: list[str], wait_s: Optional[float] = None) -> None:
        """Wait until the server and `models` are ready, else raise one ClientError saying what is there instead.

        wait_s: how long to wait for a server not up yet (None: only while models load, up to LOADING_WAIT_S)."""
        deadline = time.monotonic() + (wait_s or 0.0)
        loading_deadline = time.monotonic() + (wait_s if wait_s is not None else LOADING_WAIT_S)
        while True:
            try:
                return self._check_ready_once(models)
            except ClientError as e:
                kind = probe_port(self.url)
                if kind.startswith("http") and self.protocol == "grpc":
                    raise ClientError(
                        f"{self.url} is an HTTP port (it answered HTTP/1.1), not gRPC: add `--protocol "
                        "http`, or use the server's gRPC port (8001 by default)"
                    ) from None
                if kind == "grpc" and self.protocol == "http":
                    raise ClientError(
                        f"{self.url} is a gRPC port (it answered HTTP/2), not HTTP: drop `--protocol "
                        "http` (gRPC is the default), or use the server's HTTP port (8000 by default)"
                    ) from None
                up = kind == "grpc" or kind == "http:200"
                loading = ("is not loaded" in str(e) and up and not self._server_ready()) or (
                    "no Triton server ready" in str(e) and up
                )
                if loading or "no Triton server ready" in str(e):
                    if time.monotonic() < (loading_deadline if up else deadline):
                        time.sleep(1.0)
                        continue
                if loading:
                    raise ClientError(
                        f"the server at {self.url} is up but not ready after {wait_s or LOADING_WAIT_S:.0f}s: "
                        "its models are still loading (or one failed: see the server log); wait longer "
                        "with --wait SECONDS"
                    ) from None
                if "no Triton server ready" in str(e):
                    what = (
                        "nothing listens there"
                        if kind == "refused"
                        else f"the port answers {kind}"
                        if not kind.startswith("unreachable")
                        else "the host cannot be reached"
                    )
                    raise ClientError(
                        f"no Triton server ready at {self.url} ({self.protocol}): {what}; start one "
                        "with `trt-spec serve REPO`, or pass --wait SECONDS for one that is starting"
                    ) from None
                raise

    def _server_ready(self) -> bool:
        try:
            if self.protocol == "http":
                return _http_ok(f"http://{self.url}/v2/health/ready")
            return bool(self._grpc_client().is_server_ready())
        except Exception:  # noqa: BLE001 - not ready is what we report
            return False

    def _check_ready_once(self, models: list[str]) -> None:
        """Raise ClientError if the server or a model is not ready; maps roles onto a runtime llmapi repository."""
        if not self.llmapi and set(models) <= set(TEXT_MODELS) and self._is_llmapi():
            self.llmapi = True
            self.names = {BASELINE: lc.BASELINE_MODEL, SPECULATIVE: lc.MODEL_NAME}
        models = [self.names.get(m, m) for m in models]
        if self.llmapi and lc.BASELINE_MODEL in models and lc.MODEL_NAME in models:
            # a phased baseline is not ready by design (trt_spec_repo.json phase_models)
            self.phased = not self._model_ready(lc.BASELINE_MODEL) and self._model_ready(lc.MODEL_NAME)
            if self.phased:
                models = [m for m in models if m != lc.BASELINE_MODEL]
        if self.protocol == "http":
            base = f"http://{self.url}"
            if not _http_ok(f"{base}/v2/health/ready"):
                raise ClientError(f"no Triton server ready at {self.url} (HTTP); start one with `trt-spec serve REPO`")
            if not _is_triton_http(base):  # the metrics port answers 200 to any path
                raise ClientError(
                    f"{self.url} answers HTTP but is not Triton's HTTP API (its metrics port?); use the "
                    "server's HTTP port (8000 by default)"
                )
            for m in models:
                if not _http_ok(f"{base}/v2/models/{m}/ready"):
                    raise ClientError(
                        f"model {m!r} is not loaded on {self.url}; check the name (models: "
                        f"{', '.join(TEXT_MODELS)}) or the server log"
                    )
        else:
            c = self._grpc_client()
            try:
                ready = c.is_server_ready()
            except Exception:
                ready = False
            if not ready:
                raise ClientError(f"no Triton server ready at {self.url} (gRPC); start one with `trt-spec serve REPO`")
            for m in models:
                try:
                    ok = c.is_model_ready(m)
                except Exception:
                    ok = False
                if not ok:
                    raise ClientError(
                        f"model {m!r} is not loaded on {self.url}; check the name (models: "
                        f"{', '.join(TEXT_MODELS)}) or the server log"
                    )

    def _model_ready(self, model: str) -> bool:
        try:
            if self.protocol == "http":
                return _http_ok(f"http://{self.url}/v2/models/{model}/ready")
            return bool(self._grpc_client().is_model_ready(model))
        except Exception:  # noqa: BLE001 - not ready is the answer
            return False

    def admin_headers(self) -> dict[str, str]:
        """Headers for a restricted call in this protocol, with admin_key or serve's local key; {} if neither."""
        from ..serve.admin_key import ADMIN_HEADER, GRPC_ADMIN_HEADER

        key = self.admin_key or served_admin_key(self.url)
        if not key:
            return {}
        return {(ADMIN_HEADER if self.protocol == "http" else GRPC_ADMIN_HEADER): key}

    def restricted_error(self, what: str, message: str) -> ClientError:
        """The ClientError for a refused restricted call."""
        had = "the admin key given was refused" if self.admin_headers() else "no admin key was given"
        return ClientError(
            f"{what}: the server at {self.url} restricts it to its admin key and {had}; pass "
            "--admin-key-file FILE (the file `trt-spec serve --admin-key-file FILE` was started with; "
            "on the server's own host `trt-spec serve` leaves its key where check, bench and tune find "
            f"it) ({message.strip()})"
        )

    def model_config(self, model: str) -> dict:
        """A served model's configuration (Triton JSON); restricted, so sent with admin_headers()."""
        what = f"reading {model}'s configuration"
        if self.protocol == "http":
            req = urllib.request.Request(f"http://{self.url}/v2/models/{model}/config", headers=self.admin_headers())
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", errors="replace")
                if RESTRICTED_REFUSAL in body:
                    raise self.restricted_error(what, body) from None
                raise ClientError(f"{model}: cannot read its configuration (HTTP {e.code}: {body.strip()})") from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                raise ClientError(f"{model}: cannot read its configuration ({e})") from None
        from tritonclient.utils import InferenceServerException

        try:
            return self._grpc_client().get_model_config(model, headers=self.admin_headers() or None, as_json=True)[
                "config"
            ]
        except InferenceServerException as e:
            if RESTRICTED_REFUSAL in _grpc_message(e):
                raise self.restricted_error(what, _grpc_message(e)) from None
            raise ClientError(f"{model}: cannot read its configuration ({_grpc_message(e)})") from None

    def model_metadata(self, model: str) -> dict:
        """A served model's metadata (name, platform, inputs, outputs); not restricted.

        (upstream-facts: triton-model-metadata-platform)"""
        if self.protocol == "http":
            with urllib.request.urlopen(f"http://{self.url}/v2/models/{model}", timeout=30) as r:
                return json.loads(r.read())
        return self._grpc_client().get_model_metadata(model, as_json=True)

    def model_inputs(self, model: str) -> set[str]:
        return {i.get("name") for i in self.model_metadata(model).get("inputs", [])}

    def _is_llmapi(self) -> bool:
        """Whether the speculative model is an LLM-API model (has sampling_param_* inputs)."""
        try:
            return lc.MAX_TOKENS in self.model_inputs(lc.MODEL_NAME)
        except Exception:  # noqa: BLE001 - not there, or no server: the text models' check says which
            return False

    def check_baseline(self) -> Optional[str]:
        """Raise ClientError if the baseline runs the speculative engine itself (a trivial comparison).

        Returns a note instead when the server restricts model configs and no admin key is at hand."""
        if self.llmapi:  # the baseline is its own model without speculative_config
            return None
        try:
            bls = self.model_config(SPECULATIVE).get("parameters", {})
            base = self.model_config(BASELINE)
        except ClientError as e:
            if RESTRICTED_REFUSAL not in str(e):
                raise
            return (
                "not checked that the baseline is a non-speculative engine: the server restricts model configs to "
                "its admin key (pass --admin-key-file to check it)"
            )
        param = lambda k: bls.get(k, {}).get("string_value", "")  # noqa: E731
        steps = {s.get("model_name") for s in base.get("ensemble_scheduling", {}).get("step", [])}
        if param("speculative_mode") == "engine" and param("tensorrt_llm_model_name") in steps:
            raise ClientError(
                f"no baseline: {BASELINE} runs the speculative engine {param('tensorrt_llm_model_name')!r} "
                "itself, so identity and speedup would compare it with itself; rebuild with "
                "speculative.baseline_engine: true (a non-speculative engine for the ensemble)"
            )
        return None

    def baseline_engine(self) -> Optional[str]:
        """The engine model serving the baseline (for logits at a divergence); None for runtime llmapi."""
        if self.llmapi:
            return None
        try:
            steps = self.model_config(BASELINE).get("ensemble_scheduling", {}).get("step", [])
            found = next((s.get("model_name") for s in steps if s.get("model_name") in ENGINE_MODELS), None)
            if found:
                return found
        except Exception:  # noqa: BLE001 - a restricted or missing config: fall back to what is loaded
            pass
        try:
            if self.protocol == "http":
                loaded = _http_ok(f"http://{self.url}/v2/models/{BASELINE_ENGINE}/ready")
            else:
                loaded = bool(self._grpc_client().is_model_ready(BASELINE_ENGINE))
        except Exception:  # noqa: BLE001 - not there
            loaded = False
        return BASELINE_ENGINE if loaded else TARGET

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()
            self._grpc = None

    def generate(self, model: str, prompt: str, max_tokens: int, *, stream: bool = False, **params) -> Generation:
        if self.llmapi:
            return self._llmapi_generate(self.names.get(model, model), prompt, max_tokens, stream, params)
        if self.tenant and model == SPECULATIVE:
            params.setdefault(TENANT, self.tenant)
        fields = {TEXT_INPUT: prompt, MAX_TOKENS: int(max_tokens), STREAM: bool(stream), **params}
        if self.protocol == "http":
            return self._http(model, fields, stream)
        return self._grpc_generate(model, fields)

    def _llmapi_generate(self, model: str, prompt: str, max_tokens: int, stream: bool, params: dict) -> Generation:
        """One request to an LLM-API model; its text is re-tokenized with the target tokenizer."""
        if self.tokenizer is None:
            raise ClientError(
                f"{model} is TensorRT-LLM's LLM-API model, which returns text only: pass --tokenizer DIR "
                "(the target's) so its tokens can be counted and compared"
            )
        for name in (NUM_DRAFT_TOKENS, DRAFT_LEN_POLICY, USE_DRAFT_LOGITS):
            if name in params:
                raise ClientError(
                    f"{name}: the LLM-API model takes no per-request speculation settings (its "
                    "speculative_config is in model.yaml)"
                )
        fields = {
            lc.TEXT_INPUT: prompt,
            lc.MAX_TOKENS: int(max_tokens),
            lc.STREAMING: bool(stream),
            lc.EXCLUDE_INPUT: bool(params.pop(bc.EXCLUDE_INPUT_IN_OUTPUT, False)),
            lc.RETURN_PERF: True,
        }
        params.pop(bc.RETURN_PERF_METRICS, None)
        for name in (bc.TEMPERATURE, TOP_K, TOP_P, bc.SEED):
            if name in params:
                fields[lc.SAMPLING_PREFIX + name] = params.pop(name)
        if STOP_WORDS in params:  # lc.STOP_INPUT
            raise ClientError(f"{model}: {lc.STOP_REFUSED}")
        if params:
            raise ClientError(f"{model}: not an input of the LLM-API model: {', '.join(sorted(params))}")
        t0 = time.perf_counter()
        if self.protocol == "http":
            raw: list = []
            self._http(model, fields, stream, raw)
            parts = [(_http_outputs(ev), t) for ev, t in raw]
        else:
            inputs = _grpc_inputs(fields, LLMAPI_TYPES, batch=False)  # max_batch_size 0
            wanted = [lc.TEXT_OUTPUT, *(t.name for t in lc.PERF_OUTPUTS)]
            parts = [(_np_outputs(o), t) for o, t in self._grpc_stream(model, inputs, wanted, t0)]
        return self._llmapi_result(parts, time.perf_counter() - t0, stream)

    def _llmapi_result(self, parts: list[tuple[dict, float]], latency: float, stream: bool) -> Generation:
        """An LLM-API model's responses as a Generation.

        Each streamed response holds the whole text so far, one per executor iteration, so the tokens each adds give
        the acceptance (upstream-facts: llmapi-stream-cumulative-text)."""

        def number(v):  # upstream-facts: llmapi-perf-outputs-strings
            v = v.decode() if isinstance(v, bytes) else str(v)
            return float(v) if any(c in v for c in ".eEn") else int(v)

        metrics: dict = {}
        for p, _ in parts:
            metrics.update({k: number(v) for k, v in p["metrics"].items()})
        texts = [p["text"] for p, _ in parts]
        text = texts[-1] if texts else ""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        counts = [len(self.tokenizer.encode(t, add_special_tokens=False)) if t else 0 for t in texts]
        times = [t for (p, t), n, prev in zip(parts, counts, [0, *counts]) if n > prev]
        if int(metrics.get("total_draft_tokens", 0) or 0) > 0:
            metrics[lc.ACCEPTANCE_SOURCE] = lc.FROM_PERF_OUTPUTS
        else:  # lc.SPEC_PERF_ZERO (upstream-facts: llmapi-spec-perf-zero)
            for k in ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"):
                metrics.pop(k, None)
            if stream and len(parts) > 0 and ids:
                # accepted = tokens beyond one per streamed response; a stop string may cut the final text, so
                # count up to the longest text
                longest = max(range(len(texts)), key=lambda j: len(texts[j]))
                cut = len(texts[longest]) > len(text)
                decoded = max(len(ids), counts[longest]) if cut else len(ids)
                cases = [lc.STREAM_CUT] * cut + [lc.STREAM_CLAMPED] * (decoded < len(parts))
                metrics.update(
                    {
                        "total_accepted_draft_tokens": max(decoded - len(parts), 0),
                        TOTAL_STEPS: len(parts),
                        lc.ACCEPTANCE_SOURCE: lc.FROM_STREAMED_CHUNKS,
                        **({lc.ACCEPTANCE_NOTE: "; ".join(cases)} if cases else {}),
                    }
                )
        return Generation(
            text=text,
            output_ids=ids,
            ttft_s=times[0] if times else latency,
            latency_s=latency,
            chunks=len(times),
            chunk_times_s=times,
            metrics=metrics,
            tokens=len(ids),
        )

    def engine_logits(self, model: str, input_ids: list[int]) -> Optional[np.ndarray]:
        """Next-token logits [V] from an engine model (its context phase, teacher-forced on input_ids); None if
        built without --gather_generation_logits."""
        _, out = self._engine_request(model, input_ids, 1)
        if out is None or out.size == 0:
            return None
        self._vocab[model] = out.shape[-1] if out.ndim > 1 else out.size  # HTTP answers one flat list
        return out.reshape(-1, self._vocab[model])[0]

    def engine_generation(self, model: str, input_ids: list[int], n: int) -> tuple[list[int], Optional[np.ndarray]]:
        """(greedy tokens, logits [T, V]) of one non-streamed engine request for n tokens: row 0 from the context
        phase, the rest from generation steps (a row may follow the last token: the end-id's); logits None if built
        without --gather_generation_logits."""
        if self.protocol == "http" and model not in self._vocab and self.engine_logits(model, input_ids) is None:
            return [], None  # HTTP's flat list needs the vocabulary size, learned from one row
        tokens, out = self._engine_request(model, input_ids, n)
        if out is None or out.size == 0:
            return tokens, None
        return tokens, out.reshape(-1, out.shape[-1] if out.ndim > 1 else self._vocab[model])

    def _engine_request(self, model: str, input_ids: list[int], n: int) -> tuple[list[int], Optional[np.ndarray]]:
        """(tokens, generation_logits as sent: [1, beams, T, V] over gRPC, flat over HTTP) of one engine request."""
        fields = {
            bc.INPUT_IDS: [input_ids],
            bc.INPUT_LENGTHS: [[len(input_ids)]],
            bc.REQUEST_OUTPUT_LEN: [[int(n)]],
            bc.RETURN_GENERATION_LOGITS: [[True]],
            bc.EXCLUDE_INPUT_IN_OUTPUT: [[True]],
            bc.STREAMING: [[False]],
        }
        if self.protocol == "http":
            body = json.dumps({k: v[0] if k == bc.INPUT_IDS else v[0][0] for k, v in fields.items()}).encode()
            req = urllib.request.Request(
                f"http://{self.url}/v2/models/{model}/generate", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    got = json.loads(resp.read())
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", errors="replace").strip()
                raise ClientError(f"{model}: logits request failed (HTTP {e.code}: {body})") from None
            except (urllib.error.URLError, OSError) as e:
                raise ClientError(f"{model}: logits request failed ({e})") from None
            ids, out = got.get(bc.OUTPUT_IDS), got.get(bc.GENERATION_LOGITS)
        else:
            import tritonclient.grpc as grpcclient

            dtypes = {bc.INPUT_IDS: np.int32, bc.INPUT_LENGTHS: np.int32, bc.REQUEST_OUTPUT_LEN: np.int32}
            inputs = []
            for name, value in fields.items():
                arr = np.asarray(value, dtype=dtypes.get(name, np.bool_))
                t = grpcclient.InferInput(name, list(arr.shape), _triton_dtype(arr.dtype))
                t.set_data_from_numpy(arr)
                inputs.append(t)
            # the backend refuses requests without both mandatory outputs
            parts = self._grpc_stream(model, inputs, [*bc.MANDATORY_OUTPUTS, bc.GENERATION_LOGITS])
            ids = next((o[bc.OUTPUT_IDS] for o in parts if bc.OUTPUT_IDS in o), None)
            out = next((o[bc.GENERATION_LOGITS] for o in parts if bc.GENERATION_LOGITS in o), None)
        # output_ids are -1 padded per beam (backend_contract.OUTPUTS)
        tokens = [] if ids is None else [int(t) for t in np.asarray(ids).reshape(-1) if t >= 0]
        return tokens, None if out is None else np.asarray(out, dtype=np.float32)

    def _http(self, model: str, fields: dict, stream: bool, raw: Optional[list] = None) -> Generation:
        """raw: filled with (event, seconds) per response."""
        endpoint = "generate_stream" if stream else "generate"
        body = json.dumps({k: (bool(v) if isinstance(v, (bool, np.bool_)) else v) for k, v in fields.items()}).encode()
        req = urllib.request.Request(
            f"http://{self.url}/v2/models/{model}/{endpoint}", data=body, headers={"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        events: list[dict] = []
        times: list[float] = []
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if stream:
                    for chunk in resp:
                        line = chunk.decode("utf-8").strip()
                        if not line.startswith("data:"):
                            continue
                        ev = json.loads(line[5:])
                        if "error" in ev:
                            raise ClientError(f"{model}: {ev['error']}")
                        events.append(ev)
                        times.append(time.perf_counter() - t0)
                else:
                    events.append(json.loads(resp.read()))
                    times.append(time.perf_counter() - t0)
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except json.JSONDecodeError:
                pass
            raise ClientError(f"{model}: {detail}") from None
        except urllib.error.URLError as e:
            raise ClientError(f"cannot reach {self.url} over HTTP ({e.reason}); is the server running?") from None
        if raw is not None:
            raw.extend(zip(events, times))
        return _assemble([(_http_outputs(ev), t) for ev, t in zip(events, times)], time.perf_counter() - t0)

    def _grpc_client(self):
        if self._grpc is None:
            import tritonclient.grpc as grpcclient

            self._grpc = grpcclient.InferenceServerClient(self.url)
        return self._grpc

    def _grpc_generate(self, model: str, fields: dict) -> Generation:
        inputs = _grpc_inputs(fields, FIELD_TYPES, batch=True)
        wanted = [TEXT_OUTPUT, OUTPUT_IDS] + ([] if model == ENSEMBLE else list(METRIC_OUTPUTS))
        t0 = time.perf_counter()
        timed = self._grpc_stream(model, inputs, wanted, t0)
        return _assemble([(_np_outputs(o), t) for o, t in timed], time.perf_counter() - t0)

    def _grpc_stream(self, model: str, inputs: list, wanted: list[str], t0: Optional[float] = None) -> list:
        """One request over a fresh stream: outputs per response, as (outputs, seconds since t0) when t0 is given."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        outputs = [grpcclient.InferRequestedOutput(n) for n in wanted]
        q: "queue.Queue" = queue.Queue()
        start = time.perf_counter() if t0 is None else t0
        client = grpcclient.InferenceServerClient(self.url)  # per call: calls may run concurrently
        parts = []
        finished = False
        try:
            client.start_stream(callback=lambda result, error: q.put((result, error, time.perf_counter() - start)))
            client.async_stream_infer(model, inputs, outputs=outputs, enable_empty_final_response=True)
            while True:
                try:
                    result, error, t = q.get(timeout=self.timeout)
                except queue.Empty:
                    raise ClientError(f"{model}: no response within {self.timeout:.0f}s") from None
                if error is not None:
                    raise ClientError(f"{model}: {_grpc_message(error)}")
                resp = result.get_response()
                outs = {o.name: result.as_numpy(o.name) for o in resp.outputs}
                outs = {k: v for k, v in outs.items() if v is not None}
                if outs:
                    parts.append((outs, t) if t0 is not None else outs)
                final = resp.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    finished = True
                    break
        except InferenceServerException as e:
            raise ClientError(
                f"cannot reach {self.url} over gRPC ({_grpc_message(e)}); is the server running?"
            ) from None
        finally:
            try:
                # a plain stop_stream() waits for the server, which a stuck server never ends
                client.stop_stream(cancel_requests=not finished)
            finally:
                client.close()
        return parts


def _grpc_inputs(fields: dict, types: dict, *, batch: bool) -> list:
    """gRPC inputs: strings as BYTES, the rest typed by `types` (default INT32); batch adds a leading [1]."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in fields.items():
        if isinstance(value, (str, list)):
            arr = np.array([v.encode("utf-8") for v in (value if isinstance(value, list) else [value])], dtype=object)
        else:
            arr = np.array([value], dtype=types.get(name, np.int32))
        if batch:
            arr = arr[None]
        t = grpcclient.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == object else _triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def _grpc_message(e) -> str:
    msg = getattr(e, "message", None)
    msg = msg() if callable(msg) else (msg or str(e))
    return str(msg).strip()


def _triton_dtype(dt) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(dt)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, http.client.HTTPException):  # HTTPException: gRPC port
        return False


def _is_triton_http(base: str) -> bool:
    """Whether GET /v2 answers Triton's server metadata (not the metrics port)."""
    try:
        with urllib.request.urlopen(f"{base}/v2", timeout=5) as r:
            return "triton" in str(json.loads(r.read()).get("name", ""))
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError, AttributeError):
        return False


def probe_port(url: str, timeout: float = 2.0) -> str:
    """What answers at HOST:PORT: "refused", "unreachable", "http:STATUS", "grpc" (HTTP/2) or "other"."""
    host, _, port = url.replace("http://", "").rstrip("/").rpartition(":")
    data = b""
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as sk:
            sk.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            sk.settimeout(timeout)
            try:
                while len(data) < 16:
                    chunk = sk.recv(64)
                    if not chunk:
                        break
                    data += chunk
            except socket.timeout:
                pass
    except ConnectionRefusedError:
        return "refused"
    except (OSError, ValueError):
        return "unreachable"
    if data.startswith(b"HTTP/1."):
        parts = data.split(b" ")
        return f"http:{parts[1].decode(errors='replace') if len(parts) > 1 else '?'}"
    if len(data) >= 9 and data[3] in (0x04, 0x07):  # HTTP/2 frame header: type SETTINGS or GOAWAY
        return "grpc"
    return "other"


def _http_outputs(ev: dict) -> dict:
    text = ev.get(TEXT_OUTPUT, "")
    if isinstance(text, list):
        text = "".join(text)
    ids = ev.get(OUTPUT_IDS, [])
    ids = list(np.asarray(ids, dtype=np.int64).reshape(-1)) if ids != [] else []
    metrics = {k: ev[k] for k in METRIC_OUTPUTS if k in ev}
    for k in LIST_METRICS:  # a one-element list may arrive as a bare number
        if k in metrics and not isinstance(metrics[k], list):
            metrics[k] = [metrics[k]]
    return {"text": text, "ids": [int(i) for i in ids], "metrics": metrics}


def _np_outputs(outs: dict) -> dict:
    text = outs.get(TEXT_OUTPUT)
    text = (
        "".join(x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in text.reshape(-1))
        if text is not None
        else ""
    )
    ids = outs.get(OUTPUT_IDS)
    ids = [int(i) for i in ids.reshape(-1)] if ids is not None else []
    metrics = {}
    for k in METRIC_OUTPUTS:
        if k in outs:
            v = outs[k].reshape(-1).tolist()
            metrics[k] = v if k in LIST_METRICS else v[0]
    return {"text": text, "ids": ids, "metrics": metrics}


def _assemble(parts: list[tuple[dict, float]], latency: float) -> Generation:
    text = "".join(p["text"] for p, _ in parts)
    ids = [i for p, _ in parts for i in p["ids"]]
    token_times = [t for p, t in parts if p["ids"]]
    metrics: dict = {}
    for p, _ in parts:
        metrics.update(p["metrics"])
    ttft = token_times[0] if token_times else latency
    return Generation(
        text=text,
        output_ids=ids,
        ttft_s=ttft,
        latency_s=latency,
        chunks=len(token_times),
        chunk_times_s=token_times,
        metrics=metrics,
    )
