"""Measurement phases for a repository whose baseline is loaded for its phase only (runtime llmapi: it does not fit
beside the speculative model).

`measure` switches once per command: every speculative half, then the baseline loaded in its place for every baseline
half, then the speculative model loaded back whatever happened, under a per-HOST:PORT lock that fails fast. Results pair
by prompt, so drift between phases is not cancelled out. Triton's load blocks, unload does not (hence polling the index)
(upstream-facts: triton-load-blocks, triton-unload-async, triton-strict-readiness).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Hashable, Optional, Sequence, TypeVar

from ..records import llmapi_contract as lc
from ..records.defaults import cache_dir
from .client import LOCAL_HOSTS, RESTRICTED_REFUSAL, ClientError, LLMClient, _grpc_message

T = TypeVar("T")
_log = logging.getLogger(__name__)
PHASE_LOCKS_SUBDIR = "phase-locks"
UNLOAD_WAIT_S = 900.0  # a 70B LLM-API model's shutdown
LOAD_TIMEOUT_S = 3600.0  # a cold 70B load from network storage
PHASED_NOTE = (
    "phased: the speculative model over every prompt first, then the baseline (loaded for its phase only, "
    "in place of the speculative model) over the same prompts; paired by prompt, not interleaved in time"
)
MISSING_KEY = (
    "{url}: the baseline {base} is loaded for its phase only (it is a second full copy of the target, "
    "which does not fit beside {spec}), and switching models needs the server's admin key: pass "
    "--admin-key-file FILE (the file `trt-spec serve --admin-key-file FILE` was started with; on the "
    "server's own host `trt-spec serve` leaves its key where check and bench find it)"
)


class ModelControl:
    """Triton's model-repository API (load, unload, index), sent with the client's admin headers."""

    def __init__(self, client: LLMClient):
        self.client = client

    def _http(self, path: str, body: Optional[dict] = None, timeout: float = 60.0):
        c = self.client
        req = urllib.request.Request(
            f"http://{c.url}/v2/repository{path}",
            data=json.dumps(body or {}).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **c.admin_headers()},
        )
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
        """The repository index: [{name, version, state, reason}]."""
        if self.client.protocol == "http":
            return self._http("/index") or []
        out = self._grpc("index", lambda c, h: c.get_model_repository_index(headers=h, as_json=True))
        return list(out.get("models", []))

    def state(self, name: str) -> str:
        """The model's index state (READY, LOADING, UNLOADING, UNAVAILABLE), "" when not listed."""
        return next((m.get("state", "") for m in self.index() if m.get("name") == name), "")

    def load(self, name: str) -> None:
        if self.client.protocol == "http":
            self._http(f"/models/{name}/load", timeout=LOAD_TIMEOUT_S)
        else:
            self._grpc(f"load {name}", lambda c, h: c.load_model(name, headers=h))

    def unload(self, name: str, wait_s: float = UNLOAD_WAIT_S) -> None:
        """Unload and wait until the index no longer lists it as live (its GPU memory is free then)."""
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
                raise ClientError(
                    f"{self.client.url}: {name} still {states[0]} {wait_s:.0f}s after unload; see the server log"
                )
            time.sleep(0.2)


@contextlib.contextmanager
def _held_signals():
    """Defer Ctrl-C / SIGTERM until the block is done."""
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
    """The model-repository API, checked before anything is measured; raises ClientError without a usable key."""
    if not client.admin_headers():
        raise ClientError(MISSING_KEY.format(url=client.url, base=lc.BASELINE_MODEL, spec=lc.MODEL_NAME))
    ctl = ModelControl(client)
    names = {m.get("name") for m in ctl.index()}
    if lc.BASELINE_MODEL not in names:
        raise ClientError(
            f"{client.url}: {lc.BASELINE_MODEL} is neither loaded nor in the server's repository; "
            "regenerate the repository with trt-spec repo"
        )
    return ctl


RESTORE_FAILED = (
    "{url}: {spec} did not load back after the baseline's phase ({error}); the server is left with "
    "{state}, and {spec} is not served until it loads: load it with the repository API (POST "
    "/v2/repository/models/{spec}/load on the server's HTTP port, with its admin key in the {header} "
    "header) or restart `trt-spec serve`"
)


def _states(ctl: ModelControl) -> str:
    try:
        return ", ".join(f"{n} {ctl.state(n) or 'not listed'}" for n in (lc.MODEL_NAME, lc.BASELINE_MODEL))
    except ClientError as e:
        return f"models in an unknown state (the repository index did not answer: {e})"


def _restore(ctl: ModelControl, note: Callable[[str], None], gate=None) -> Optional[ClientError]:
    """Unload the baseline and always try to reload the speculative model; returns the reload's error or None."""
    from ..serve.admin_key import ADMIN_HEADER

    note(f"unloading {lc.BASELINE_MODEL}, loading {lc.MODEL_NAME} back")
    try:
        if ctl.state(lc.BASELINE_MODEL) in ("READY", "LOADING", "UNLOADING"):
            ctl.unload(lc.BASELINE_MODEL)
    except Exception as e:  # noqa: BLE001 - the reload below is tried anyway
        _log.warning("unloading %s after its phase failed: %s", lc.BASELINE_MODEL, e)
    try:
        if gate is not None:
            gate.wait(lc.BASELINE_MODEL, lc.MODEL_NAME)
        ctl.load(lc.MODEL_NAME)
    except Exception as e:  # noqa: BLE001 - one line, with the state and the fix
        return ClientError(
            RESTORE_FAILED.format(
                url=ctl.client.url, spec=lc.MODEL_NAME, error=e, state=_states(ctl), header=ADMIN_HEADER
            )
        )
    return None


def memory_gate(url: str, note: Callable[[str], None]):
    """The GPU-memory check run after each unload (serve/gpu_memory.py), or None, said once, when it cannot run."""
    from ..serve.gpu_memory import GpuMemoryGate

    gate, why = GpuMemoryGate.for_server(url)
    if gate is None:
        note(f"no GPU-memory check after each unload: {why}")
    return gate


@contextlib.contextmanager
def baseline_phase(client: LLMClient, ctl: Optional[ModelControl] = None, note: Callable[[str], None] = lambda s: None):
    """The baseline in place of the speculative model for the block, which is always restored afterwards.

    Each load waits for the unloaded model's GPU memory to come back (memory_gate). The block's own error wins (a
    failed restore is noted on it); after a good block a failed restore raises."""
    ctl = ctl or require_control(client)
    gate = memory_gate(client.url, note)
    note(f"unloading {lc.MODEL_NAME}, loading {lc.BASELINE_MODEL} (a model load: minutes for a 70B target)")
    try:
        try:
            ctl.unload(lc.MODEL_NAME)
            if gate is not None:
                gate.wait(lc.MODEL_NAME, lc.BASELINE_MODEL)
            ctl.load(lc.BASELINE_MODEL)
            yield
        except BaseException as e:
            with _held_signals():
                failed = _restore(ctl, note, gate)
            if failed is not None:
                _log.warning("%s", failed)
                if hasattr(e, "add_note"):  # Python 3.11+
                    e.add_note(f"restore: {failed}")
            raise
        with _held_signals():
            failed = _restore(ctl, note, gate)
        if failed is not None:
            raise failed
    finally:
        if gate is not None:
            gate.close()


def _lock_path(url: str):
    host, _, port = url.replace("http://", "").rstrip("/").rpartition(":")
    host = "localhost" if host in LOCAL_HOSTS or host.startswith("127.") else host
    return cache_dir() / PHASE_LOCKS_SUBDIR / (re.sub(r"[^A-Za-z0-9.-]", "_", f"{host}_{port}") + ".lock")


@contextlib.contextmanager
def switch_lock(url: str):
    """Held for one phase cycle; a second run against the same HOST:PORT fails at once (a wait would look hung)."""
    import fcntl

    path = _lock_path(url)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        _log.warning(
            "no phase lock for %s (%s: %s): another run could switch its models at the same time", url, path, e.strerror
        )
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise ClientError(
                f"{url}: another trt-spec run on this host is switching this server's models (pid "
                f"{holder}; lock {path}); run again when it is done"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {' '.join(sys.argv[:3])}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (as does dying)


def is_phased(client) -> bool:
    return bool(getattr(client, "phased", False))


Stage = Callable[[str, int], "tuple[ContextManager, Optional[Callable]]"]


def _no_stage(label: str, total: int):
    return contextlib.nullcontext(), None


@dataclass
class Measurement:
    """One measurement of both models, interleaved or as two halves joined by pair(spec, base).

    Callables take a progress callback or None; halves sharing a baseline_key run their baseline once per cycle."""

    label: str
    total: int
    interleaved: Callable[[Any], Any]
    speculative: Callable[[Any], Any]
    baseline: Callable[[Any], Any]
    pair: Callable[[Any, Any], Any]
    half_total: int
    baseline_key: Optional[Hashable] = None


def measure(
    client,
    measurements: Sequence[Measurement],
    *,
    stage: Stage = _no_stage,
    note: Callable[[str], None] = lambda s: None,
) -> list:
    """Each measurement's result, interleaved or in one phase cycle; stage(label, total) -> (ctx, progress)."""

    def run(fn: Callable, label: str, total: int):
        ctx, cb = stage(label, total)
        with ctx:
            return fn(cb)

    if not is_phased(client):
        return [run(m.interleaved, m.label, m.total) for m in measurements]
    return _cycle(client, measurements, run, note)


def _cycle(client, measurements: Sequence[Measurement], run: Callable, note: Callable[[str], None]) -> list:
    """One phase cycle: speculative halves, the switch, distinct baseline halves, the restore."""
    ctl = require_control(client)
    with switch_lock(client.url):
        spec = [run(m.speculative, f"{m.label} (speculative)", m.half_total) for m in measurements]
        base: dict = {}
        keys = [m.baseline_key if m.baseline_key is not None else ("own", i) for i, m in enumerate(measurements)]
        with baseline_phase(client, ctl, note):
            for m, key in zip(measurements, keys):
                if key not in base:
                    base[key] = run(m.baseline, f"{m.label} (baseline)", m.half_total)
    return [m.pair(s, base[key]) for m, s, key in zip(measurements, spec, keys)]


def speculative_then_baseline(
    client: LLMClient,
    speculative: Callable[[], T],
    baseline: Callable[[], T],
    note: Callable[[str], None] = lambda s: None,
) -> tuple[T, T]:
    """speculative(), then baseline() in the baseline's phase."""
    m = Measurement("", 0, speculative, lambda _: speculative(), lambda _: baseline(), lambda s, b: (s, b), 0)
    return _cycle(client, [m], lambda fn, label, total: fn(None), note)[0]
