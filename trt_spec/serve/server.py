"""Server launcher: `tritonserver --model-repository …` (one process per rank under mpirun when TP/PP > 1).

Finds tritonserver: /opt/tritonserver/bin/tritonserver (NGC image), else the binary bundled in the PyPI wheel
nvidia-pytriton, prepared per ../shared/TRITON_ON_CPU.md (backends copied into a private work dir with the
python-backend stub of this interpreter, LD_LIBRARY_PATH = this interpreter's libpython + nvidia_pytriton.libs,
PATH led by this interpreter's bin). Binds 127.0.0.1 unless told otherwise and waits for readiness (an error names
the failing models from the log, which stays on disk).

What a started server guarantees:
- it dies with its launcher: tritonserver (or mpirun) gets SIGTERM when the launcher exits for any reason,
  kill -9 included (PR_SET_PDEATHSIG), and its python-backend stubs exit with it;
- stop() ends the whole process group and removes the work dir and the python-backend shared-memory regions;
- the admin APIs (shared-memory, model-config, model-repository, trace, logging) answer only requests carrying the
  header ADMIN_HEADER (gRPC: GRPC_ADMIN_HEADER) with the admin key; health, metadata, statistics and inference stay
  open. model-config is restricted because the configs name this machine's engine and tokenizer directories
  (absolute, as NVIDIA's templates write them, so any launch finds them); the key of a running server is in
  admin_key_path(PORT) for its HTTP and gRPC ports (0600, removed on stop), where the harness on the same host finds it;
- the python backend's shared-memory regions (prompt text passes through them) are made owner-only as they
  appear (Triton 2.51 creates them 0644 whatever the umask; a process that opened one in that first ~0.1 s
  keeps its access);
- dead_models() notices a python-backend stub that died (Triton 2.51 never restarts them: every request to that
  model fails while /v2/health/ready still answers 200).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..records import defaults
from ..records.manifest import ManifestError, RepoRecord
from ..records.procutil import die_with_parent, shell_line
from ..in_triton.serving import CANCELLING, DRAIN_FILE_ENV, DRAINING

SHM_DIR = Path("/dev/shm")
WORKDIR_PREFIX = "trt-spec-triton-"
STUB_NAME = "triton_python_backend_stub"
NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
NGC_PYTHON_STUB = Path("/opt/tritonserver/backends/python") / STUB_NAME
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # picks nvidia-pytriton's stub
# Admin APIs, restricted on both protocols (tritonserver --http-restricted-api / --grpc-restricted-protocol).
RESTRICTED_APIS = ("shared-memory", "model-config", "model-repository", "trace", "logging")
ADMIN_HEADER = "triton-admin-key"
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"  # Triton prefixes the key of a restricted gRPC protocol
ADMIN_KEY_RE = re.compile(r"[A-Za-z0-9._~+/-]{16,}")
MODEL_DIED_EXIT = 3  # `trt-spec serve` exit code when a model's python-backend process died


class ServerError(RuntimeError):
    pass


# The model `drain()` asks the server to load: it refuses to, so the server reports not ready while it drains.
DRAIN_MODEL = "trt_spec_draining"
DRAIN_MODEL_CONFIG = {"name": DRAIN_MODEL, "backend": "python", "max_batch_size": 0,
                      "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
                      "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]}
DRAIN_MODEL_PY = ("class TritonPythonModel:\n"
                  "    def initialize(self, args):\n"
                  "        raise RuntimeError('trt-spec serve is draining: the server is shutting down')\n")


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    shm_prefix: str = ""
    plain: str = ""  # the real launch without serve's extras (ports, keys, drain), as a user can type it anywhere
    plain_backends: Optional[Path] = None  # nvidia-pytriton: the backend directory `plain` names (prepare_plain)
    workdir: Optional[Path] = None  # the backends copy to prepare before starting (nvidia-pytriton only)
    admin_key: str = ""  # header value that unlocks RESTRICTED_APIS; never printed
    admin_key_shown: str = ""  # what shell() prints in its place
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        text = shell_line(self.argv, self.env)
        return text.replace(self.admin_key, self.admin_key_shown) if self.admin_key else text

    def prepare_plain(self) -> None:
        """Make the backend directory `plain` names (nvidia-pytriton's backends and this interpreter's stub, in the
        cache: defaults.cache_dir()); nothing to do for the NGC image's tritonserver."""
        if self.plain_backends is not None:
            prepare_cached_backends(self.plain_backends)


def repo_info(repo: Path, record: Optional[RepoRecord] = None) -> tuple[int, bool, list[int]]:
    """(tritonserver processes under mpirun, orchestrator mode, GPU ids) from the repository's record: the one given,
    else its trt_spec_repo.json; (1, False, [0]) for a repository trt-spec did not write. An old or foreign record
    is refused with one line."""
    if record is None:
        if not Path(repo).is_dir():
            raise ServerError(f"{repo}: model repository not found; write one with `trt-spec repo BUILD_DIR --out "
                              f"{repo}`")
        if (Path(repo) / "manifest.json").is_file() and not (Path(repo) / "trt_spec_repo.json").is_file():
            raise ServerError(f"{repo} is a build directory, not a model repository; write one from it, then serve "
                              f"that: trt-spec repo {repo} --out {Path(repo) / 'repo'} && trt-spec serve "
                              f"{Path(repo) / 'repo'}")
        from ..repository.llmapi import missing_sources

        missing = missing_sources(Path(repo))
        if missing:
            raise ServerError(missing[0])
        try:
            record = RepoRecord.read(Path(repo))
        except ManifestError as e:
            raise ServerError(str(e)) from None
    if record is None:
        return 1, False, [0]
    return record.mpi_ranks, record.orchestrator, list(record.gpu_ids or [0])


def launch_models(repo: Path, record: Optional[RepoRecord] = None) -> list[str]:
    """The models the launch loads by name when the repository has phase-only models (its record's load_models);
    [] (every model) otherwise, or for a repository trt-spec did not write."""
    if record is None:
        try:
            record = RepoRecord.read(Path(repo))
        except ManifestError as e:
            raise ServerError(str(e)) from None
    return list(record.load_models) if record is not None and record.phase_models else []


# ---------------------------------------------------------------------------------------------------------
# Finding tritonserver and the python-backend stub (also what `trt-spec doctor` reports)


def pytriton_dir() -> Optional[Path]:
    """The `pytriton/tritonserver` directory of nvidia-pytriton, found without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return d if d.is_dir() else None


def find_tritonserver() -> Optional[Path]:
    """NGC image binary first, then the one bundled in nvidia-pytriton, then PATH."""
    if NGC_TRITONSERVER.is_file():
        return NGC_TRITONSERVER
    d = pytriton_dir()
    if d is not None and (d / "bin" / "tritonserver").is_file():
        return d / "bin" / "tritonserver"
    which = shutil.which("tritonserver")
    return Path(which) if which else None


def _pytriton_stub(d: Path) -> Path:
    """nvidia-pytriton's python-backend stub for this interpreter (d: pytriton_dir()); it may be absent."""
    return d / "python_backend_stubs" / PYTHON_VERSION / STUB_NAME


def python_backend_stub() -> Optional[Path]:
    """The NGC image's stub first, then nvidia-pytriton's for this interpreter; None when neither is there."""
    if NGC_PYTHON_STUB.is_file():
        return NGC_PYTHON_STUB
    d = pytriton_dir()
    if d is not None and _pytriton_stub(d).is_file():
        return _pytriton_stub(d)
    return None


def _pytriton_layout(workdir: Path) -> tuple[Path, Path, dict[str, str]]:
    """(stub to copy, backend dir in workdir, env) for the binary bundled in nvidia-pytriton; copies nothing."""
    d = pytriton_dir()
    if d is None:
        raise ServerError("no tritonserver: not in the NGC image and nvidia-pytriton is not installed; "
                          "pip install 'trt-spec[serve]' (or run `make setup`)")
    stub = _pytriton_stub(d)
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no python-backend stub for Python {PYTHON_VERSION}; "
                          "use Python 3.8-3.13")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = d.parent.parent / "nvidia_pytriton.libs"
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (libdir, str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return stub, workdir / "backends", env


def prepare_pytriton_backends(workdir: Path) -> tuple[Path, dict[str, str]]:
    """Copy pytriton's backends + this interpreter's stub into workdir; return (backend dir, env)."""
    stub, backends, env = _pytriton_layout(workdir)
    if not backends.exists():
        shutil.copytree(pytriton_dir() / "backends", backends)
        shutil.copy2(stub, backends / "python" / STUB_NAME)
    return backends, env


def plain_backends_dir() -> Path:
    """The backend directory the plain command names on nvidia-pytriton: its backends plus this interpreter's stub, in
    the per-user cache, one per nvidia-pytriton version and Python version (a work dir dies with its server)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("nvidia-pytriton")
    except PackageNotFoundError:
        v = "unknown"
    return defaults.cache_dir() / defaults.PLAIN_BACKENDS_SUBDIR / f"pytriton-{v}-py{PYTHON_VERSION}" / "backends"


def prepare_cached_backends(backends: Path) -> Path:
    """Make `backends` (plain_backends_dir()) once: copied beside it, then renamed into place (two launchers at once
    both succeed)."""
    backends = Path(backends)
    if (backends / "python" / STUB_NAME).is_file():
        return backends
    backends.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".backends-", dir=backends.parent))
    try:
        made, _ = prepare_pytriton_backends(tmp)
        try:
            os.replace(made, backends)
        except OSError:
            if not (backends / "python" / STUB_NAME).is_file():
                raise
    except OSError as e:
        raise ServerError(f"cannot prepare the backend directory {backends}: {e.strerror}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return backends


def admin_key_path(port: int) -> Path:
    """Where `trt-spec serve` leaves the admin key of its server on `port` (its HTTP and its gRPC port) while it runs."""
    return defaults.cache_dir() / defaults.ADMIN_KEYS_SUBDIR / f"{int(port)}.key"


def write_admin_key_files(key: str, ports: list[int]) -> list[Path]:
    """The key, one line, in admin_key_path(port) for each port: owner-only (directory 0700, file 0600 from creation)
    and atomic (written beside, then renamed). Returns the files written; a cache that cannot be written is skipped
    (the harness then asks for --admin-key-file)."""
    written = []
    for port in ports:
        path = admin_key_path(port)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(key + "\n")
            os.replace(tmp, path)
            written.append(path)
        except OSError:
            continue
    return written


def remove_admin_key_files(key: str, paths: list[Path]) -> None:
    """Remove the files write_admin_key_files wrote, each only while it still holds this server's key."""
    for path in paths:
        try:
            if path.read_text().strip() == key:
                path.unlink()
        except OSError:
            pass


def _dir_bytes(d: str) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def engine_bytes(repo: Path) -> int:
    """Bytes of weights the launch loads: the repository's engine files (the sizes its record stores, else what the
    engine directories hold on disk); for runtime llmapi, the checkpoint and the draft/head directories that the
    model.yaml of each model loaded at launch names. 0 for a repository without engines or record."""
    try:
        record = RepoRecord.read(Path(repo))
    except ManifestError:
        return 0
    if record is None:
        return 0
    total = 0
    for d, sums in record.engines.items():
        total += sum(int(f.get("size", 0)) for f in sums.files.values()) if sums.files else _dir_bytes(d)
    from ..records import llmapi_contract as lc

    for name in record.load_models or []:
        f = Path(repo) / name / "1" / lc.YAML_FILE
        if not f.is_file():
            continue
        import yaml

        y = yaml.safe_load(f.read_text()) or {}
        dirs = [y.get("model"), (y.get("speculative_config") or {}).get(lc.SPEC_MODEL_DIR)]
        total += sum(_dir_bytes(d) for d in dirs if isinstance(d, str) and os.path.isdir(d))
    return total


def repo_ready_timeout_s(repo: Path) -> float:
    """serve's default ready timeout for the repository: defaults.ready_timeout_s of the weights it loads, plus the
    LLM API's start-up work after the weights (CUDA-graph capture, autotuning) on a GPU."""
    try:
        record = RepoRecord.read(Path(repo))
    except ManifestError:
        record = None
    from ..records import llmapi_contract as lc

    llmapi_gpu = bool(record and record.engine == "tensorrt"
                      and any((Path(repo) / m / "1" / lc.YAML_FILE).is_file() for m in record.load_models or []))
    return defaults.ready_timeout_s(engine_bytes(repo)) + (defaults.LLMAPI_READY_EXTRA_S if llmapi_gpu else 0.0)


def read_admin_key(path: Path) -> str:
    """The admin key stored in path; a missing file is created with a random key, readable by its owner only."""
    path = Path(path)
    try:
        if not path.exists():
            key = secrets.token_urlsafe(32)
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(key + "\n")
            return key
        key = path.read_text().strip()
    except OSError as e:
        raise ServerError(f"admin key file {path}: {e.strerror}") from None
    if not ADMIN_KEY_RE.fullmatch(key):
        raise ServerError(f"admin key file {path}: the key must be one line of at least 16 characters from "
                          f"A-Z a-z 0-9 . _ ~ + / -; make one with: python -c 'import secrets; "
                          f"print(secrets.token_urlsafe(32))' > {shlex.quote(str(path))}")
    return key


def launch_spec(repo: Path, *, http_port: int = defaults.HTTP_PORT, grpc_port: int = defaults.GRPC_PORT,
                metrics_port: int = defaults.METRICS_PORT, host: str = defaults.HOST,
                workdir: Optional[Path] = None, binary: Optional[Path] = None, verbose: bool = False, prepare: bool = True,
                admin_key: Optional[str] = None, admin_key_file: Optional[Path] = None,
                record: Optional[RepoRecord] = None, shm_prefix: Optional[str] = None) -> LaunchSpec:
    """The exact command line(s); world size and orchestrator mode come from the repository's record (`record`: the
    record of a repository that need not exist here, e.g. a pod's; computed, nothing read or written).

    With nvidia-pytriton's binary the backends are copied into workdir (prepare=False: later, by the caller); without
    a workdir the command names a placeholder WORKDIR and copies nothing. admin_key unlocks the restricted APIs
    (default: a random key nobody is told; admin_key_file only changes how shell() shows it).
    """
    repo = Path(repo).resolve()
    world, orchestrator, gpu_ids = repo_info(repo, record)
    loads = launch_models(repo, record)  # [] = every model (--load-model=*)
    binary = binary or find_tritonserver()
    if binary is None:
        raise ServerError("tritonserver not found; use the NGC image or `pip install 'trt-spec[serve]'`")
    env: dict[str, str] = {}
    backend_args: list[str] = []
    notes: list[str] = []
    spec_workdir: Optional[Path] = None
    if binary != NGC_TRITONSERVER and pytriton_dir() is not None and str(binary).startswith(str(pytriton_dir())):
        if workdir is None:
            _, backends, env = _pytriton_layout(Path("WORKDIR"))
            notes.append("WORKDIR: trt-spec serve copies nvidia-pytriton's backends and this interpreter's "
                         "python-backend stub into a private temporary directory and removes it on stop")
        elif prepare:
            backends, env = prepare_pytriton_backends(Path(workdir))
        else:
            _, backends, env = _pytriton_layout(Path(workdir))
            spec_workdir = Path(workdir)
        backend_args = [f"--backend-directory={backends}"]
    if orchestrator:
        # Two TRT-LLM models with TP/PP > 1: orchestrator mode, as NVIDIA's scripts/launch_triton_server.py
        # --multi-model runs it: one tritonserver under `mpirun -n 1`, the backend spawns the ranks, and the
        # server keeps no pinned/CUDA memory pools or peer access of its own (they collide with the workers').
        env["TRTLLM_ORCHESTRATOR"] = "1"
        env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1"
    # unique per server, also within one process; a fixed one for a pod (its own /dev/shm)
    prefix = shm_prefix or f"trtspec{os.getpid()}_{secrets.token_hex(3)}_"
    if admin_key is not None and not ADMIN_KEY_RE.fullmatch(admin_key):
        raise ServerError("the admin key must be at least 16 characters from A-Z a-z 0-9 . _ ~ + / -")
    key = admin_key or secrets.token_urlsafe(32)
    shown = (f'"$(cat {shlex.quote(str(admin_key_file))})"' if admin_key_file else
             "\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')\"")
    restricted = ",".join(RESTRICTED_APIS) + f":{ADMIN_HEADER}={key}"

    # The plain launch (what `repo` and `serve` print): the same processes, environment, repository (its configs name
    # absolute paths, so any working directory does), backends and pools, without serve's own extras (addresses,
    # restricted APIs, explicit model control, drain); ranks get NVIDIA's launch_triton_server.py shm prefixes.
    plain_backends = plain_backends_dir() if backend_args else None
    plain_backend_args = [f"--backend-directory={plain_backends}"] if plain_backends else []

    def rank_args(rank: int, plain: bool = False) -> list[str]:
        if plain:
            a = [str(binary), f"--model-repository={repo}", *plain_backend_args]
            if world > 1 and not orchestrator:
                a += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        else:
            a = [str(binary), f"--model-repository={repo}", *backend_args, "--disable-auto-complete-config",
                 f"--backend-config=python,shm-region-prefix-name={prefix}{rank}_",
                 f"--exit-timeout-secs={defaults.EXIT_TIMEOUT_S}"]
        if orchestrator:
            a += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
            a += [f"--cuda-memory-pool-byte-size={g}:0" for g in gpu_ids]
        if rank > 0:  # worker ranks load only the engine and expose no endpoints
            a += ["--model-control-mode=explicit", "--load-model=tensorrt_llm",
                  "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"]
        elif plain and loads:  # a repository with phase-only models: load the launch's models only, never all
            a += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in loads)]
        elif not plain:
            # explicit model control with every model loaded at start (as mode none does): `trt-spec serve` drains
            # by loading a model that refuses to load, which turns /v2/health/ready false (TritonServer.drain).
            # A repository with phase-only models (its record's phase_models: the LLM-API baseline) loads the
            # launch's models by name instead (Triton refuses --load-model=* beside another --load-model: server
            # docs/user_guide/model_management.md r26.04, "Model Control Mode EXPLICIT")
            a += ["--model-control-mode=explicit", *([f"--load-model={m}" for m in loads] or ["--load-model=*"])]
            a += [f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                  f"--http-address={host}", f"--grpc-address={host}", f"--metrics-address={host}",
                  f"--http-restricted-api={restricted}", f"--grpc-restricted-protocol={restricted}"]
            if verbose:
                a.append("--log-verbose=1")
        return a

    def processes(plain: bool) -> list[str]:
        if orchestrator:
            return ["mpirun", "--allow-run-as-root", "-n", "1", *rank_args(0, plain)]
        if world == 1:
            return rank_args(0, plain)
        argv = ["mpirun", "--allow-run-as-root"]
        for rank in range(world):
            argv += ["-n", "1", *rank_args(rank, plain)] + ([":"] if rank < world - 1 else [])
        return argv

    return LaunchSpec(processes(False), env, shm_prefix=prefix, plain=shell_line(processes(True), env),
                      plain_backends=plain_backends, workdir=spec_workdir, admin_key=key, admin_key_shown=shown,
                      notes=notes)


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise ServerError(f"{what} port {port} on {host} is already in use; pass --{what}-port with a free port "
                              "or stop the other server") from None


def free_port(host: str = defaults.HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def default_log_path(repo: Path, http_port: int = defaults.HTTP_PORT) -> Path:
    """Next to the repository, so it outlives the server's temporary work dir, and one per server (two servers of
    one repository on other ports keep their own): REPO/../REPO_NAME.tritonserver.HTTP_PORT.log."""
    repo = Path(repo).resolve()
    return repo.parent / f"{repo.name}.tritonserver.{http_port}.log"


# --- the Triton log: the lines that say why the server stopped -----------------------------------------------------

_LOG_LINE = re.compile(r"^([EWIF])\d{4} [\d:.]+\s+\d+ [^\]]*\] (.*)$")
_GPU_ABSENT = re.compile(r"CudaDriverHelper|CUDA driver|NVML|DCGM", re.I)  # expected on a machine without a GPU


def _log_message(raw: str) -> str:
    """One-line form of a log record: the first line, plus the innermost frame of a Python backend's `At:` block."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = raw[1:-1].replace("\\n", "\n")
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
    if not lines:
        return ""
    first = lines[0]
    if "At:" in lines[1:]:
        frames = lines[lines.index("At:") + 1:]
        if frames:
            first += f" (at {frames[0]})"
    return first


def log_errors(text: str, limit: int = 8) -> list[str]:
    """The error lines of a Triton log, cause first: each model's `failed to load …` (else every E-level record,
    those a machine without a GPU always logs last), the last line of each Python traceback, and tritonserver's
    final `error: …`."""
    records: list[str] = []
    tracebacks: list[str] = []
    final: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _LOG_LINE.match(line)
        if m and m.group(1) in "EF":
            records.append(_log_message(m.group(2)))
        elif line.startswith("error: "):
            final.append(line.strip())
        elif line.startswith("Traceback (most recent call last):"):
            for nxt in lines[i + 1:]:
                if nxt and not nxt[0].isspace():
                    tracebacks.append(nxt.strip())
                    break
    loads = [r for r in records if r.startswith("failed to load")]
    others = [r for r in records if r and r not in loads]
    quiet = [r for r in others if _GPU_ABSENT.search(r)]
    causes = loads or [r for r in others if r not in quiet] + quiet  # a failed load says it all
    picked = causes + tracebacks + final
    out: list[str] = []
    for r in picked:
        r = r if len(r) <= 500 else r[:497] + "..."
        if r not in out:
            out.append(r)
    return out[:limit]


# --- processes ----------------------------------------------------------------------------------------------------

def _proc_stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, ppid, start time) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # comm may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """Every process below pid, zombies included (children, grandchildren: tritonserver under mpirun, its stubs)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            st = _proc_stat(int(p.name))
            if st is not None:
                children.setdefault(st[1], []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def stub_model(argv: list[str]) -> str:
    """The model a python-backend stub serves. Its argv (Triton 2.51):
    stub REPO/MODEL/VERSION/model.py SHM_REGION SHM_SIZE SHM_GROWTH PARENT_PID STUB_DIR IPC_SIZE INSTANCE RUNTIME;
    the model is the directory two levels above the model file, else the instance name without `_GROUP_INDEX`."""
    if len(argv) > 1 and argv[1].endswith(".py") and len(Path(argv[1]).parts) >= 4:
        return Path(argv[1]).parent.parent.name
    for a in reversed(argv[1:]):
        m = re.fullmatch(r"(.+)_\d+_\d+", a)
        if m:
            return m.group(1)
    return "?"


def _remove_stale_workdirs() -> None:
    """Work dirs left by launchers killed with -9: this user's, whose launcher pid is gone and that no live process
    names on its command line (an orphaned server still shutting down keeps its own)."""
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
        used = "\0".join("\0".join(_cmdline(int(p.name))) for p in Path("/proc").iterdir() if p.name.isdigit())
        for d in stale:
            if str(d) not in used:
                shutil.rmtree(d, ignore_errors=True)


@dataclass(frozen=True)
class DeadModel:
    model: str
    pid: int


def dead_models_message(dead: list[DeadModel], restart: str) -> str:
    """One line for `trt-spec serve` to print when a model's python-backend process died."""
    names = ", ".join(sorted({d.model for d in dead}))
    pids = ", ".join(str(d.pid) for d in dead)
    what = f"model {names} stopped (its python-backend process {pids} died)" if len(dead) == 1 else \
        f"models {names} stopped (their python-backend processes {pids} died)"
    return f"error: {what}; stopping the server — restart it with: {restart}"


class TritonServer:
    """A running tritonserver: start() -> wait_ready() -> stop(). Also a context manager.

    The server gets SIGTERM when the thread that called start() exits: start it from a thread that outlives it.
    """

    def __init__(self, repo: Path, *, http_port: int = defaults.HTTP_PORT, grpc_port: int = defaults.GRPC_PORT,
                 metrics_port: int = defaults.METRICS_PORT, host: str = defaults.HOST,
                 log_path: Optional[Path] = None, verbose: bool = False, admin_key_file: Optional[Path] = None):
        self.repo = Path(repo)
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        # created by start(), removed by stop(); the pid in the name lets a later launcher remove it after a kill -9
        self.workdir = Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.log_path = Path(log_path) if log_path else default_log_path(self.repo, http_port)
        repo_info(self.repo)  # a missing repository is the error, before the key file is touched
        key = read_admin_key(Path(admin_key_file)) if admin_key_file else None  # else random: admin APIs off
        self.spec = launch_spec(self.repo, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                host=host, workdir=self.workdir, prepare=False, verbose=verbose, admin_key=key,
                                admin_key_file=admin_key_file)
        # serving.DRAIN_FILE_ENV: the models read it (drain()); in the private work dir, with the backends copy
        self.drain_file = self.workdir / "drain"
        self.spec.env[DRAIN_FILE_ENV] = str(self.drain_file)
        self.ready_timeout = repo_ready_timeout_s(self.repo)  # wait_ready's default
        self._key_files: list[Path] = []  # admin_key_path(port) of the HTTP and gRPC ports, while it runs
        self.proc: Optional[subprocess.Popen] = None
        self.is_serving = False  # set by the caller once ready and serving (trt-spec serve: a signal then drains)
        self._log = None
        self._seen: dict[int, tuple[str, int]] = {}  # stub pid -> (model, start time)
        self._stubs: Optional[dict[int, tuple[str, int]]] = None  # the watched ones

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
            # umask: files tritonserver creates are its owner's only (the python backend's /dev/shm regions are
            # not: boost sets them 0644 explicitly, so wait_ready() narrows them).
            # the configs name absolute paths: tritonserver runs in the launcher's working directory, as the plain
            # command does (the tensorrtllm backend resolves a relative gpt_model_path against it)
            self.proc = subprocess.Popen(self.spec.argv, env={**os.environ, **self.spec.env}, stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         umask=0o077, preexec_fn=die_with_parent(signal.SIGTERM))
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
        """Owner-only python-backend shared-memory regions (requests and responses, prompt text included, pass
        through them; Triton 2.51 creates them 0644 whatever the umask)."""
        for f in SHM_DIR.glob(f"{self.spec.shm_prefix}*"):
            try:
                f.chmod(0o600)
            except OSError:
                pass

    def wait_ready(self, timeout: Optional[float] = None) -> "TritonServer":
        """timeout: default self.ready_timeout (defaults.ready_timeout_s of the repository's engine bytes)."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.protect_shm()
            self._scan_stubs()
            if self.proc is not None and self.proc.poll() is not None:
                msg = self.failure(f"tritonserver exited with code {self.proc.returncode} before becoming ready")
                self._cleanup()
                raise ServerError(msg)
            if self.is_ready():
                self.protect_shm()
                self.watch()
                return self
            time.sleep(0.1)
        msg = self.failure(f"tritonserver not ready after {timeout:.0f}s")
        self.stop()
        raise ServerError(msg)

    def stubs(self) -> dict[int, str]:
        """pid -> model of every running python-backend stub below the server (under mpirun one level lower)."""
        if self.proc is None:
            return {}
        out = {}
        for pid in descendants(self.proc.pid):
            argv = _cmdline(pid)  # empty for a zombie
            if argv and argv[0].endswith(STUB_NAME):
                out[pid] = stub_model(argv)
        return out

    def _stub_alive(self, pid: int, started: int) -> bool:
        st = _proc_stat(pid)
        return st is not None and st[0] not in "ZX" and st[2] == started

    def _scan_stubs(self) -> None:
        """Remember each stub seen (while loading too: one that dies before watch() is a zombie without argv)."""
        for pid, model in self.stubs().items():
            st = _proc_stat(pid)
            if st is not None and model != "?":  # a stub not (yet) showing a model's argv serves no model to watch
                self._seen[pid] = (model, st[2])

    def watch(self) -> None:
        """Watch the stubs seen so far: the live ones, and dead ones whose model has no live stub now."""
        self._scan_stubs()
        live = {pid for pid, (_, started) in self._seen.items() if self._stub_alive(pid, started)}
        served = {self._seen[pid][0] for pid in live}
        self._stubs = {pid: v for pid, v in self._seen.items() if pid in live or v[0] not in served}

    def dead_models(self) -> list[DeadModel]:
        """Watched stubs that exited or are zombies while Triton still counts their model READY (Triton 2.51 does not
        restart them, nor notice: their model is dead). A model unloaded on purpose — check/bench's baseline phase
        (harness/phases.py) unloads the speculative model and loads it back — is not: its stub's exit is the unload,
        and the index says UNAVAILABLE/LOADING until a new stub serves it (rescanned here)."""
        self.watch()
        dead = [DeadModel(model, pid) for pid, (model, started) in (self._stubs or {}).items()
                if not self._stub_alive(pid, started)]
        ready = self.ready_models() if dead else None
        return dead if ready is None else [d for d in dead if d.model in ready]

    def ready_models(self) -> Optional[set[str]]:
        """The models Triton's repository index calls READY (the admin API: serve's key); None if it cannot tell."""
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}", method="POST",
                                     headers={ADMIN_HEADER: self.spec.admin_key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return {m.get("name") for m in json.loads(r.read() or b"[]") if m.get("state") == "READY"}
        except (urllib.error.URLError, OSError, ValueError):
            return None

    # --- draining (what `trt-spec serve` does on SIGTERM) --------------------------------------------------------
    def drain(self) -> None:
        """Stop admitting: the models refuse new requests with a "shutting down" line (serving.DRAIN_FILE_ENV) and
        /v2/health/ready turns false; requests in flight go on. Triton's readiness is all its models' (strict
        readiness, core server.cc IsReady: a model in any state but READY, unless unloaded, makes the server not
        ready), and a python backend cannot mark a model unready, so the server is asked to load one more model
        (DRAIN_MODEL, its files sent with the request) that refuses to load."""
        self._set_state(DRAINING)
        # the load returns once the refusing model's stub has started and failed (seconds on 2 cores): off the caller's
        # thread, so that --drain-timeout counts from the signal, not from the end of this load
        threading.Thread(target=self._load_drain_model, name="trt-spec-drain", daemon=True).start()

    def _load_drain_model(self) -> None:
        body = json.dumps({"parameters": {"config": json.dumps(DRAIN_MODEL_CONFIG),
                                          "file:1/model.py": base64.b64encode(DRAIN_MODEL_PY.encode()).decode()}})
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/models/{DRAIN_MODEL}/load",
                                     data=body.encode(), method="POST",
                                     headers={ADMIN_HEADER: self.spec.admin_key, "Content-Type": "application/json"})
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
        """Requests the server still works on, from its metrics: those holding an engine slot
        (nv_trt_llm_request_metrics active, the backend's and the stand-in's), those the speculative model holds
        (trt_spec_requests_in_flight) and those queued in any model's scheduler (nv_inference_pending_request_count).
        -1 when the metrics cannot be read."""
        from ..records.backend_contract import REQUEST_METRICS
        from ..records.names import METRIC_IN_FLIGHT
        from ..in_triton.spec_metrics import scrape, value

        try:
            samples = scrape(f"http://{self._client_host()}:{self.metrics_port}/metrics", timeout_s=5.0)
        except (OSError, ValueError):
            return -1
        return int(value(samples, REQUEST_METRICS, request_type="active") + value(samples, METRIC_IN_FLIGHT)
                   + value(samples, "nv_inference_pending_request_count"))

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
