"""The launch of a model repository: `tritonserver --model-repository …`, one process per rank under mpirun when
TP/PP > 1 (or one under `mpirun -n 1` in orchestrator mode), as exact argv and environment (LaunchSpec), beside the
plain launch a user can type anywhere; and what the launch loads (the bytes of weights, hence how long to wait)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..records import defaults
from ..records.manifest import ManifestError, RepoRecord
from ..records.procutil import shell_line
from .admin_key import launch_key, restricted_arg, shown_key
from .errors import ServerError
from .locate import (
    NGC_TRITONSERVER,
    find_tritonserver,
    is_pytriton,
    plain_backends_dir,
    prepare_cached_backends,
    prepare_pytriton_backends,
    pytriton_layout,
)


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
            raise ServerError(
                f"{repo}: model repository not found; write one with `trt-spec repo BUILD_DIR --out {repo}`"
            )
        if (Path(repo) / "manifest.json").is_file() and not (Path(repo) / "trt_spec_repo.json").is_file():
            raise ServerError(
                f"{repo} is a build directory, not a model repository; write one from it, then serve "
                f"that: trt-spec repo {repo} --out {Path(repo) / 'repo'} && trt-spec serve "
                f"{Path(repo) / 'repo'}"
            )
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


@dataclass(frozen=True)
class _Ranks:
    """What every rank's argv is made of; rank_args/processes give serve's launch (plain=False) or the plain one."""

    binary: Path
    repo: Path
    world: int
    orchestrator: bool
    gpu_ids: list[int]
    loads: list[str]  # [] = every model (--load-model=*)
    backend_args: list[str]
    plain_backend_args: list[str]
    shm_prefix: str
    serving_args: list[str]  # rank 0 of serve's launch: addresses, ports, restricted APIs, log level

    def rank_args(self, rank: int, plain: bool = False) -> list[str]:
        if plain:
            a = [str(self.binary), f"--model-repository={self.repo}", *self.plain_backend_args]
            if self.world > 1 and not self.orchestrator:
                a += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        else:
            a = [
                str(self.binary),
                f"--model-repository={self.repo}",
                *self.backend_args,
                "--disable-auto-complete-config",
                f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}{rank}_",
                f"--exit-timeout-secs={defaults.EXIT_TIMEOUT_S}",
            ]
        if self.orchestrator:
            a += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
            a += [f"--cuda-memory-pool-byte-size={g}:0" for g in self.gpu_ids]
        if rank > 0:  # worker ranks load only the engine and expose no endpoints
            a += [
                "--model-control-mode=explicit",
                "--load-model=tensorrt_llm",
                "--allow-http=false",
                "--allow-grpc=false",
                "--allow-metrics=false",
            ]
        elif plain and self.loads:  # a repository with phase-only models: load the launch's models only, never all
            a += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in self.loads)]
        elif not plain:
            # explicit model control with every model loaded at start (as mode none does): `trt-spec serve` drains
            # by loading a model that refuses to load, which turns /v2/health/ready false (TritonServer.drain).
            # A repository with phase-only models (its record's phase_models: the LLM-API baseline) loads the
            # launch's models by name instead (Triton refuses --load-model=* beside another --load-model: server
            # docs/user_guide/model_management.md r26.04, "Model Control Mode EXPLICIT")
            a += ["--model-control-mode=explicit", *([f"--load-model={m}" for m in self.loads] or ["--load-model=*"])]
            a += self.serving_args
        return a

    def processes(self, plain: bool) -> list[str]:
        if self.orchestrator:
            return ["mpirun", "--allow-run-as-root", "-n", "1", *self.rank_args(0, plain)]
        if self.world == 1:
            return self.rank_args(0, plain)
        argv = ["mpirun", "--allow-run-as-root"]
        for rank in range(self.world):
            argv += ["-n", "1", *self.rank_args(rank, plain)] + ([":"] if rank < self.world - 1 else [])
        return argv


def _backends(binary: Path, workdir: Optional[Path], prepare: bool):
    """(backend args, env, notes, the work dir left to prepare) of the binary: nvidia-pytriton's needs its backends
    copied into workdir (now, or by the caller when prepare=False; a placeholder WORKDIR without one)."""
    if not is_pytriton(binary):
        return [], {}, [], None
    notes, spec_workdir = [], None
    if workdir is None:
        _, backends, env = pytriton_layout(Path("WORKDIR"))
        notes.append(
            "WORKDIR: trt-spec serve copies nvidia-pytriton's backends and this interpreter's "
            "python-backend stub into a private temporary directory and removes it on stop"
        )
    elif prepare:
        backends, env = prepare_pytriton_backends(Path(workdir))
    else:
        _, backends, env = pytriton_layout(Path(workdir))
        spec_workdir = Path(workdir)
    return [f"--backend-directory={backends}"], env, notes, spec_workdir


def launch_spec(
    repo: Path,
    *,
    http_port: int = defaults.HTTP_PORT,
    grpc_port: int = defaults.GRPC_PORT,
    metrics_port: int = defaults.METRICS_PORT,
    host: str = defaults.HOST,
    workdir: Optional[Path] = None,
    binary: Optional[Path] = None,
    verbose: bool = False,
    prepare: bool = True,
    admin_key: Optional[str] = None,
    admin_key_file: Optional[Path] = None,
    record: Optional[RepoRecord] = None,
    shm_prefix: Optional[str] = None,
) -> LaunchSpec:
    """The exact command line(s); world size and orchestrator mode come from the repository's record (`record`: the
    record of a repository that need not exist here, e.g. a pod's; computed, nothing read or written).

    With nvidia-pytriton's binary the backends are copied into workdir (prepare=False: later, by the caller); without
    a workdir the command names a placeholder WORKDIR and copies nothing. admin_key unlocks the restricted APIs
    (default: a random key nobody is told; admin_key_file only changes how shell() shows it).
    """
    repo = Path(repo).resolve()
    world, orchestrator, gpu_ids = repo_info(repo, record)
    loads = launch_models(repo, record)
    binary = binary or find_tritonserver()
    if binary is None:
        raise ServerError("tritonserver not found; use the NGC image or `pip install 'trt-spec[serve]'`")
    backend_args, env, notes, spec_workdir = _backends(binary, workdir, prepare)
    if orchestrator:
        # Two TRT-LLM models with TP/PP > 1: orchestrator mode, as NVIDIA's scripts/launch_triton_server.py
        # --multi-model runs it: one tritonserver under `mpirun -n 1`, the backend spawns the ranks, and the
        # server keeps no pinned/CUDA memory pools or peer access of its own (they collide with the workers').
        env["TRTLLM_ORCHESTRATOR"] = "1"
        env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] = "1"
    # unique per server, also within one process; a fixed one for a pod (its own /dev/shm)
    prefix = shm_prefix or f"trtspec{os.getpid()}_{secrets.token_hex(3)}_"
    key = launch_key(admin_key)
    serving = [
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        f"--http-address={host}",
        f"--grpc-address={host}",
        f"--metrics-address={host}",
        f"--http-restricted-api={restricted_arg(key)}",
        f"--grpc-restricted-protocol={restricted_arg(key)}",
    ]
    # The plain launch (what `repo` and `serve` print): the same processes, environment, repository (its configs name
    # absolute paths, so any working directory does), backends and pools, without serve's own extras (addresses,
    # restricted APIs, explicit model control, drain); ranks get NVIDIA's launch_triton_server.py shm prefixes.
    plain_backends = plain_backends_dir() if backend_args else None
    ranks = _Ranks(
        binary,
        repo,
        world,
        orchestrator,
        gpu_ids,
        loads,
        backend_args,
        [f"--backend-directory={plain_backends}"] if plain_backends else [],
        prefix,
        serving + (["--log-verbose=1"] if verbose else []),
    )
    return LaunchSpec(
        ranks.processes(False),
        env,
        shm_prefix=prefix,
        plain=shell_line(ranks.processes(True), env),
        plain_backends=plain_backends,
        workdir=spec_workdir,
        admin_key=key,
        admin_key_shown=shown_key(admin_key_file),
        notes=notes,
    )


def plain_launch(repo: Path, engine: str) -> Optional[str]:
    """The real launch of a written repository as `trt-spec repo` prints it (mpirun, orchestrator variables, pools,
    backend directory; the NGC image's tritonserver for TensorRT engines), its backend directory prepared; None where
    no tritonserver is known."""
    try:
        spec = launch_spec(repo, binary=NGC_TRITONSERVER if engine == "tensorrt" else None)
        spec.prepare_plain()
    except ServerError:
        return None
    return spec.plain


# --- what the launch loads -----------------------------------------------------------------------------------------


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

    llmapi_gpu = bool(
        record
        and record.engine == "tensorrt"
        and any((Path(repo) / m / "1" / lc.YAML_FILE).is_file() for m in record.load_models or [])
    )
    return defaults.ready_timeout_s(engine_bytes(repo)) + (defaults.LLMAPI_READY_EXTRA_S if llmapi_gpu else 0.0)
