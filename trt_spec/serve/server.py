"""A running tritonserver (TritonServer) on serve/launch.py's launch.

It dies with its launcher (PR_SET_PDEATHSIG, kill -9 included), answers the admin APIs only with its admin key,
makes the python backend's shared-memory regions owner-only as they appear, notices dead stubs and can drain.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from ..in_triton.serving import CANCELLING, DRAIN_FILE_ENV, DRAINING
from ..records import defaults
from ..records.procutil import die_with_parent
from .admin_key import ADMIN_HEADER, read_admin_key, remove_admin_key_files, write_admin_key_files
from .errors import ServerError
from .launch import ServedRepository, launch_spec
from .locate import prepare_pytriton_backends
from .triton_log import loading_models, log_errors, starved_stub
from .watchdog import DeadModel, StubWatch, cmdline, stub_state, stubs_below

SHM_DIR = Path("/dev/shm")
WORKDIR_PREFIX = "trt-spec-triton-"

# drain() loads this model; it refuses to load, so the server reports not ready.
DRAIN_MODEL = "trt_spec_draining"
DRAIN_MODEL_CONFIG = {
    "name": DRAIN_MODEL,
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
}
DRAIN_MODEL_PY = (
    "class TritonPythonModel:\n"
    "    def initialize(self, args):\n"
    "        raise RuntimeError('trt-spec serve is draining: the server is shutting down')\n"
)


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise ServerError(
                f"{what} port {port} on {host} is already in use; pass --{what}-port with a free port "
                "or stop the other server"
            ) from None


def free_port(host: str = defaults.HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_log_path(repo: Path, http_port: int = defaults.HTTP_PORT) -> Path:
    """Beside the repository (it outlives the work dir), one per HTTP port."""
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.tritonserver.{http_port}.log"


def _remove_stale_workdirs() -> None:
    """Remove this user's work dirs whose launcher is gone and that no live process names (kill -9 leftovers)."""
    stale = []
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        m = re.match(rf"{WORKDIR_PREFIX}(\d+)-", d.name)
        try:
            if m and d.stat().st_uid == os.getuid():
                os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            stale.append(d)
        except OSError:
            pass
    if stale:
        used = "\0".join("\0".join(cmdline(int(p.name))) for p in Path("/proc").iterdir() if p.name.isdigit())
        for d in stale:
            if str(d) not in used:
                shutil.rmtree(d, ignore_errors=True)


class TritonServer:
    """A running tritonserver: start() -> wait_ready() -> stop(), or a context manager.

    The server gets SIGTERM when the thread that called start() exits.
    """

    def __init__(
        self,
        repo: Path,
        *,
        http_port: int = defaults.HTTP_PORT,
        grpc_port: int = defaults.GRPC_PORT,
        metrics_port: int = defaults.METRICS_PORT,
        host: str = defaults.HOST,
        log_path: Optional[Path] = None,
        verbose: bool = False,
        admin_key_file: Optional[Path] = None,
    ):
        self.served = repo if isinstance(repo, ServedRepository) else ServedRepository.load(Path(repo))
        self.repo = self.served.path
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        # the pid in the name lets a later launcher remove it after a kill -9
        self.workdir = Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.log_path = Path(log_path) if log_path else default_log_path(self.repo, http_port)
        key = read_admin_key(Path(admin_key_file)) if admin_key_file else None  # else random: admin APIs off
        self.spec = launch_spec(
            self.served,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            host=host,
            workdir=self.workdir,
            prepare=False,
            verbose=verbose,
            admin_key=key,
            admin_key_file=admin_key_file,
        )
        self.drain_file = self.workdir / "drain"
        self.spec.env[DRAIN_FILE_ENV] = str(self.drain_file)
        self.ready_timeout = self.served.ready_timeout_s()
        self.note: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
        self._key_files: list[Path] = []
        self.proc: Optional[subprocess.Popen] = None
        self.is_serving = False  # set by the caller once serving: a signal then drains
        self._log = None
        self._stub_watch = StubWatch()

    @property
    def http_url(self) -> str:
        return f"{self._client_host()}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host()}:{self.grpc_port}"

    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def start(self) -> "TritonServer":
        for what, port in (("http", self.http_port), ("grpc", self.grpc_port), ("metrics", self.metrics_port)):
            check_port_free(self.host if self.host != "0.0.0.0" else "", port, what)
        try:
            self._log = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")
        except OSError as e:
            raise ServerError(f"cannot write the server log {self.log_path}: {e.strerror}; pass --log PATH") from None
        try:
            _remove_stale_workdirs()
            self.workdir.mkdir(mode=0o700)
            if self.spec.workdir is not None:
                prepare_pytriton_backends(self.workdir)
            # umask 077, but the shm regions ignore it (upstream-facts: triton-python-shm-0644); the working
            # directory stays the launcher's, as for the plain command (upstream-facts: tensorrtllm-model-path-cwd)
            self.proc = subprocess.Popen(
                self.spec.argv,
                env={**os.environ, **self.spec.env},
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                umask=0o077,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
            self._key_files = write_admin_key_files(self.spec.admin_key, [self.http_port, self.grpc_port])
        except BaseException:
            self._cleanup()
            raise
        return self

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def failure(self, headline: str) -> str:
        """headline + the error lines of the log (cause first) + where the full log is; the tail if no error line."""
        try:
            errors = log_errors(self.log_path.read_text(errors="replace"))
        except OSError:
            errors = []
        body = "\n".join(f"  {e}" for e in errors) if errors else f"log tail:\n{self.log_tail()}"
        return f"{headline}:\n{body}\nfull log: {self.log_path}"

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def protect_shm(self) -> None:
        """Make the python-backend shared-memory regions (prompt text passes through them) owner-only."""
        for f in SHM_DIR.glob(f"{self.spec.shm_prefix}*"):
            try:
                f.chmod(0o600)
            except OSError:
                pass

    def wait_ready(
        self, timeout: Optional[float] = None, restarts: int = defaults.STUB_START_RESTARTS
    ) -> "TritonServer":
        """Wait for every model; a start that a starved python-backend stub failed is started again, `restarts`
        times at most, within the same timeout."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.protect_shm()
            self._stub_watch.scan(self.stubs())
            if self.proc is not None and self.proc.poll() is not None:
                if restarts > 0 and self._starved_stub():
                    restarts -= 1
                    self._restart()
                    continue
                msg = self.failure(f"tritonserver exited with code {self.proc.returncode} before becoming ready")
                self._cleanup()
                raise ServerError(msg)
            if self.is_ready():
                self.protect_shm()
                self.watch()
                return self
            time.sleep(0.1)
        msg = self.failure(self._not_ready(timeout))
        self.stop()
        raise ServerError(msg)

    def _starved_stub(self) -> bool:
        """The server failed its start because a python-backend stub missed the health check while it loaded
        (upstream-facts: triton-python-stub-start-health)."""
        try:
            return starved_stub(self.log_path.read_text(errors="replace"))
        except OSError:
            return False

    def _restart(self) -> None:
        """Keep the failed start's log beside the new one, then start again on the same ports and key."""
        rc, first = self.proc.returncode, self.log_path.with_name(self.log_path.name + ".failed-start")
        self._cleanup()
        try:
            os.replace(self.log_path, first)
        except OSError:
            pass
        self.note(
            f"note: tritonserver exited with code {rc} while loading: a python-backend stub got no CPU for over a "
            f"second (a busy machine) and failed the backend's health check; starting it again (that log: {first})"
        )
        self._stub_watch = StubWatch()
        self.start()

    def _not_ready(self, timeout: float) -> str:
        """The timeout's headline: the models still loading, what their stubs are doing, and how to wait longer."""
        try:
            loading = loading_models(self.log_path.read_text(errors="replace"))
        except OSError:
            loading = []
        if not loading:
            return f"tritonserver not ready after {timeout:.0f}s"
        stubs = {model: pid for pid, model in self.stubs().items()}
        what = ", ".join(f"{m} ({stub_state(stubs[m]) if m in stubs else 'no python stub'})" for m in loading)
        return (
            f"tritonserver not ready after {timeout:.0f}s: still loading {what}; if they are only slow, wait longer "
            f"with `trt-spec serve --timeout SECONDS` (the default, {self.ready_timeout:.0f}s here, is "
            f"{defaults.READY_TIMEOUT_S:.0f}s + {defaults.READY_S_PER_ENGINE_GIB:.0f}s per GiB of engine files)"
        )

    def stubs(self) -> dict[int, str]:
        return stubs_below(self.proc.pid) if self.proc is not None else {}

    def watch(self) -> None:
        self._stub_watch.watch(self.stubs())

    def dead_models(self) -> list[DeadModel]:
        """Watched stubs that died while Triton still counts their model READY (a model unloaded on purpose is not
        READY)."""
        dead = self._stub_watch.dead(self.stubs())
        ready = self.ready_models() if dead else None
        return dead if ready is None else [d for d in dead if d.model in ready]

    def ready_models(self) -> Optional[set[str]]:
        """The models Triton's repository index calls READY; None if it cannot tell."""
        req = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/index",
            data=b"{}",
            method="POST",
            headers={ADMIN_HEADER: self.spec.admin_key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return {m.get("name") for m in json.loads(r.read() or b"[]") if m.get("state") == "READY"}
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def drain(self) -> None:
        """Stop admitting new requests and turn /v2/health/ready false; requests in flight go on.

        A python model cannot mark itself unready, so a refusing DRAIN_MODEL is loaded instead
        (upstream-facts: triton-strict-readiness)."""
        self._set_state(DRAINING)
        # off the caller's thread: --drain-timeout counts from the signal, not from the end of this load
        threading.Thread(target=self._load_drain_model, name="trt-spec-drain", daemon=True).start()

    def _load_drain_model(self) -> None:
        body = json.dumps(
            {
                "parameters": {
                    "config": json.dumps(DRAIN_MODEL_CONFIG),
                    "file:1/model.py": base64.b64encode(DRAIN_MODEL_PY.encode()).decode(),
                }
            }
        )
        req = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/models/{DRAIN_MODEL}/load",
            data=body.encode(),
            method="POST",
            headers={ADMIN_HEADER: self.spec.admin_key, "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=30).close()
        except urllib.error.HTTPError as e:  # 400 "load failed for model ...": what we asked for
            e.close()
        except (urllib.error.URLError, OSError):
            pass  # the server is gone or stuck: stop() deals with it

    def cancel_in_flight(self) -> None:
        """The drain timeout passed: the models end the requests still running with a clear error."""
        self._set_state(CANCELLING)

    def _set_state(self, state: str) -> None:
        tmp = self.drain_file.with_suffix(".tmp")
        tmp.write_text(state)
        os.replace(tmp, self.drain_file)

    def in_flight(self) -> int:
        """Requests the server still works on (active, held by the speculative model, or queued), from its metrics;
        -1 when they cannot be read."""
        from ..in_triton.spec_metrics import scrape, value
        from ..records.backend_contract import REQUEST_METRICS
        from ..records.names import METRIC_IN_FLIGHT

        try:
            samples = scrape(f"http://{self._client_host()}:{self.metrics_port}/metrics", timeout_s=5.0)
        except (OSError, ValueError):
            return -1
        return int(
            value(samples, REQUEST_METRICS, request_type="active")
            + value(samples, METRIC_IN_FLIGHT)
            + value(samples, "nv_inference_pending_request_count")
        )

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self.proc is not None:
            try:  # stray children of the group (python-backend stubs)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for f in SHM_DIR.glob(f"{self.spec.shm_prefix}*"):
            try:
                f.unlink()
            except OSError:
                pass
        remove_admin_key_files(self.spec.admin_key, self._key_files)
        self._key_files = []
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "TritonServer":
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()
