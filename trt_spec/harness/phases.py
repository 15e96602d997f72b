"""Measurement phases for a repository whose baseline is loaded for its phase only (runtime llmapi: the baseline is a
second full copy of the target, which does not fit beside the speculative model; records/manifest.py RepoRecord
phase_models, serve/llmapi_repository.py PHASE_MODELS).

`check` and `bench` then measure the speculative model first, over every prompt; then unload it, load the baseline,
measure it over the same prompts, unload it and load the speculative model back, even when the run fails or is
interrupted (Ctrl-C / SIGTERM during the restore are held until it is done). Results are paired by prompt, not
interleaved in time: drift between the phases (thermal, other tenants) is not cancelled out as alternating does.

Triton, r26.04 (checked in triton-inference-server/core and server at r26.04):
- load (POST /v2/repository/models/NAME/load; gRPC RepositoryModelLoad) returns once the model is loaded or failed to
  (include/triton/core/tritonserver.h TRITONSERVER_ServerLoadModel: "does not return until the model is loaded or
  fails to load");
- unload returns at once ("does not wait for the requested model to be fully unload", TRITONSERVER_ServerUnloadModel),
  so the switch polls the repository index (POST /v2/repository/index) until the model is UNAVAILABLE, its GPU
  memory given back, before loading the other (src/model_repository_manager/model_lifecycle.cc: state_reason
  "unloaded");
- both are the model-repository API, which `trt-spec serve` restricts to its admin key (serve/server.py
  RESTRICTED_APIS): without the key the harness stops before measuring anything, with one line naming
  --admin-key-file;
- while the baseline loads, the server reports not ready (core src/server.cc InferenceServer::IsReady, strict
  readiness: a model neither READY nor "unloaded" makes the server not ready) and the speculative model is not
  served: each switch is a model load, minutes for a 70B target.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Optional, TypeVar

from ..records import llmapi_contract as lc
from .client import RESTRICTED_REFUSAL, ClientError, LLMClient, _grpc_message

T = TypeVar("T")
UNLOAD_WAIT_S = 900.0  # a 70B LLM-API model's shutdown included
LOAD_TIMEOUT_S = 3600.0  # one HTTP load call: a cold 70B load from network storage
PHASED_NOTE = ("phased: the speculative model over every prompt first, then the baseline (loaded for its phase only, "
               "in place of the speculative model) over the same prompts; paired by prompt, not interleaved in time")
MISSING_KEY = ("{url}: the baseline {base} is loaded for its phase only (it is a second full copy of the target, "
               "which does not fit beside {spec}), and switching models needs the server's admin key: pass "
               "--admin-key-file FILE (the file `trt-spec serve --admin-key-file FILE` was started with; on the "
               "server's own host `trt-spec serve` leaves its key where check and bench find it)")


class ModelControl:
    """Triton's model-repository API (load, unload, index) for the client's server, with its admin headers."""

    def __init__(self, client: LLMClient):
        self.client = client

    def _http(self, path: str, body: Optional[dict] = None, timeout: float = 60.0):
        c = self.client
        req = urllib.request.Request(f"http://{c.url}/v2/repository{path}", data=json.dumps(body or {}).encode(),
                                     method="POST", headers={"Content-Type": "application/json", **c.admin_headers()})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", errors="replace")
            if RESTRICTED_REFUSAL in detail:
                raise c.restricted_error(f"the model repository API ({path})", detail) from None
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise ClientError(f"{c.url}: {path.strip('/')} failed: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise ClientError(f"cannot reach {c.url} over HTTP ({e}); is the server running?") from None

    def _grpc(self, what: str, call):
        from tritonclient.utils import InferenceServerException

        try:
            return call(self.client._grpc_client(), self.client.admin_headers() or None)
        except InferenceServerException as e:
            msg = _grpc_message(e)
            if RESTRICTED_REFUSAL in msg:
                raise self.client.restricted_error(f"the model repository API ({what})", msg) from None
            raise ClientError(f"{self.client.url}: {what} failed: {msg}") from None

    def index(self) -> list[dict]:
        """[{name, version, state, reason}] of the repository's models (Triton's repository index)."""
        if self.client.protocol == "http":
            return self._http("/index") or []
        out = self._grpc("index", lambda c, h: c.get_model_repository_index(headers=h, as_json=True))
        return list(out.get("models", []))

    def load(self, name: str) -> None:
        if self.client.protocol == "http":
            self._http(f"/models/{name}/load", timeout=LOAD_TIMEOUT_S)
        else:
            self._grpc(f"load {name}", lambda c, h: c.load_model(name, headers=h))

    def unload(self, name: str, wait_s: float = UNLOAD_WAIT_S) -> None:
        """Unload and wait until the model is gone (UNAVAILABLE in the index): its GPU memory is free then."""
        if self.client.protocol == "http":
            self._http(f"/models/{name}/unload")
        else:
            self._grpc(f"unload {name}", lambda c, h: c.unload_model(name, headers=h))
        deadline = time.monotonic() + wait_s
        while True:
            states = [m.get("state", "") for m in self.index() if m.get("name") == name]
            if not any(s in ("READY", "LOADING", "UNLOADING") for s in states):
                return
            if time.monotonic() > deadline:
                raise ClientError(f"{self.client.url}: {name} still {states[0]} {wait_s:.0f}s after unload; see the "
                                  "server log")
            time.sleep(0.2)


@contextlib.contextmanager
def _held_signals():
    """Ctrl-C / SIGTERM wait until the block is done (the restore of the speculative model), then interrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda sig, _f: got.append(sig))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise KeyboardInterrupt


def require_control(client: LLMClient) -> ModelControl:
    """The model-repository API, checked before anything is measured: one line naming --admin-key-file without a
    key, the server's refusal with a wrong one."""
    if not client.admin_headers():
        raise ClientError(MISSING_KEY.format(url=client.url, base=lc.BASELINE_MODEL, spec=lc.MODEL_NAME))
    ctl = ModelControl(client)
    names = {m.get("name") for m in ctl.index()}
    if lc.BASELINE_MODEL not in names:
        raise ClientError(f"{client.url}: {lc.BASELINE_MODEL} is neither loaded nor in the server's repository; "
                          "regenerate the repository with trt-spec repo")
    return ctl


@contextlib.contextmanager
def baseline_phase(client: LLMClient, ctl: Optional[ModelControl] = None, note: Callable[[str], None] = lambda s: None):
    """Within the block the baseline is loaded in place of the speculative model; after it (error and interrupt
    included) the speculative model is loaded back."""
    ctl = ctl or require_control(client)
    note(f"unloading {lc.MODEL_NAME}, loading {lc.BASELINE_MODEL} (a model load: minutes for a 70B target)")
    ctl.unload(lc.MODEL_NAME)
    try:
        ctl.load(lc.BASELINE_MODEL)
        yield
    finally:
        with _held_signals():
            note(f"unloading {lc.BASELINE_MODEL}, loading {lc.MODEL_NAME} back")
            try:
                ctl.unload(lc.BASELINE_MODEL)
            finally:
                ctl.load(lc.MODEL_NAME)


def is_phased(client) -> bool:
    return bool(getattr(client, "phased", False))


def speculative_then_baseline(client: LLMClient, speculative: Callable[[], T], baseline: Callable[[], T],
                              note: Callable[[str], None] = lambda s: None) -> tuple[T, T]:
    """speculative() with the launch's models, then baseline() in the baseline's phase; the key is checked first."""
    ctl = require_control(client)
    spec = speculative()
    with baseline_phase(client, ctl, note):
        base = baseline()
    return spec, base
