"""Server launcher: `tritonserver --model-repository …` (one process per rank under mpirun when TP/PP > 1).

Finds tritonserver: /opt/tritonserver/bin/tritonserver (NGC image), else the binary bundled in the PyPI wheel
nvidia-pytriton, prepared per ../shared/TRITON_ON_CPU.md (backends copied with the python-backend stub of this
interpreter, LD_LIBRARY_PATH = this interpreter's libpython + nvidia_pytriton.libs, PATH led by this
interpreter's bin). Binds 127.0.0.1 unless told otherwise, waits for readiness (the error carries the log
tail), stops the whole process group on Ctrl-C/SIGTERM and removes its python-backend shared-memory regions.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .doctor import NGC_TRITONSERVER, find_tritonserver, pytriton_dir

DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002
DEFAULT_HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0
SHM_DIR = Path("/dev/shm")


class ServerError(RuntimeError):
    pass


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    shm_prefix: str = ""
    plain: str = ""  # the plain `tritonserver --model-repository …` a user can run directly

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


def repo_info(repo: Path) -> dict:
    f = Path(repo) / "trt_spec_repo.json"
    if not Path(repo).is_dir():
        raise ServerError(f"{repo}: model repository not found; write one with `trt-spec repo BUILD_DIR --out {repo}`")
    if not f.is_file():
        return {"mpi_ranks": 1, "orchestrator": False}
    return json.loads(f.read_text())


def prepare_pytriton_backends(workdir: Path) -> tuple[Path, dict[str, str]]:
    """Copy pytriton's backends + this interpreter's stub into workdir; return (backend dir, env)."""
    d = pytriton_dir()
    if d is None:
        raise ServerError("no tritonserver: not in the NGC image and nvidia-pytriton is not installed; "
                          "pip install 'trt-spec[serve]' (or run `make setup`)")
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = d / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no python-backend stub for Python {ver}; use Python 3.8-3.13")
    backends = workdir / "backends"
    if not backends.exists():
        shutil.copytree(d / "backends", backends)
        shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = d.parent.parent / "nvidia_pytriton.libs"
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (libdir, str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return backends, env


def launch_spec(repo: Path, *, http_port: int = DEFAULT_HTTP_PORT, grpc_port: int = DEFAULT_GRPC_PORT,
                metrics_port: int = DEFAULT_METRICS_PORT, host: str = DEFAULT_HOST, workdir: Optional[Path] = None,
                binary: Optional[Path] = None, verbose: bool = False) -> LaunchSpec:
    """The exact command line(s); world size and orchestrator mode come from the repository's manifest."""
    repo = Path(repo).resolve()
    info = repo_info(repo)
    world = int(info.get("mpi_ranks", 1))
    binary = binary or find_tritonserver()
    if binary is None:
        raise ServerError("tritonserver not found; use the NGC image or `pip install 'trt-spec[serve]'`")
    env: dict[str, str] = {}
    backend_args: list[str] = []
    if binary != NGC_TRITONSERVER and pytriton_dir() is not None and str(binary).startswith(str(pytriton_dir())):
        backends, env = prepare_pytriton_backends(workdir or Path(tempfile.mkdtemp(prefix="trt-spec-triton-")))
        backend_args = [f"--backend-directory={backends}"]
    orchestrator = bool(info.get("orchestrator"))
    if orchestrator:
        # Two TRT-LLM models with TP/PP > 1: orchestrator mode, as NVIDIA's scripts/launch_triton_server.py
        # --multi-model runs it: one tritonserver under `mpirun -n 1`, the backend spawns the ranks, and the
        # server keeps no pinned/CUDA memory pools or peer access of its own (they collide with the workers').
        env["TRTLLM_ORCHESTRATOR"] = "1"
        env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1"
    prefix = f"trtspec{os.getpid()}_"

    def rank_args(rank: int) -> list[str]:
        a = [str(binary), f"--model-repository={repo}", *backend_args, "--disable-auto-complete-config",
             f"--backend-config=python,shm-region-prefix-name={prefix}{rank}_", "--exit-timeout-secs=10"]
        if orchestrator:
            a += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
            a += [f"--cuda-memory-pool-byte-size={g}:0" for g in info.get("gpu_ids") or [0]]
        if rank == 0:
            a += [f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                  f"--http-address={host}", f"--grpc-address={host}", f"--metrics-address={host}"]
            if verbose:
                a.append("--log-verbose=1")
        else:  # worker ranks load only the engine and expose no endpoints
            a += ["--model-control-mode=explicit", "--load-model=tensorrt_llm",
                  "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        return a

    plain = shlex.join([str(binary), f"--model-repository={repo}"])
    if orchestrator:
        return LaunchSpec(["mpirun", "--allow-run-as-root", "-n", "1", *rank_args(0)], env, prefix, plain)
    if world == 1:
        return LaunchSpec(rank_args(0), env, prefix, plain)
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world):
        argv += ["-n", "1", *rank_args(rank)] + ([":"] if rank < world - 1 else [])
    return LaunchSpec(argv, env, prefix, plain)


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise ServerError(f"{what} port {port} on {host} is already in use; pass --{what}-port with a free port "
                              "or stop the other server") from None


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TritonServer:
    """A running tritonserver: start() -> wait_ready() -> stop(). Also a context manager."""

    def __init__(self, repo: Path, *, http_port: int = DEFAULT_HTTP_PORT, grpc_port: int = DEFAULT_GRPC_PORT,
                 metrics_port: int = DEFAULT_METRICS_PORT, host: str = DEFAULT_HOST, log_path: Optional[Path] = None,
                 verbose: bool = False):
        self.repo = Path(repo)
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        self.workdir = Path(tempfile.mkdtemp(prefix="trt-spec-triton-"))
        self.log_path = log_path or (self.workdir / "tritonserver.log")
        self.spec = launch_spec(self.repo, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                host=host, workdir=self.workdir, verbose=verbose)
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

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
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.spec.argv, env={**os.environ, **self.spec.env}, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> "TritonServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_tail()
                self._cleanup()
                raise ServerError(f"tritonserver exited with code {self.proc.returncode} before becoming ready; "
                                  f"log tail:\n{tail}")
            if self.is_ready():
                return self
            time.sleep(0.25)
        tail = self.log_tail()
        self.stop()
        raise ServerError(f"tritonserver not ready after {timeout:.0f}s (log {self.log_path}); log tail:\n{tail}")

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
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "TritonServer":
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()
