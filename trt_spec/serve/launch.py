"""The launch of a model repository (tritonserver, under mpirun when TP/PP > 1) as exact argv and environment, beside
the plain launch a user can type anywhere; and the bytes of weights it loads."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..records import defaults
from ..records.manifest import REPO_META, ManifestError, RepoRecord
from ..records.procutil import shell_line
from ..records.speculation import Runtime
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
    plain: str = ""  # the launch without serve's extras (ports, keys, drain)
    plain_backends: Optional[Path] = None  # nvidia-pytriton: the backend directory `plain` names
    workdir: Optional[Path] = None  # nvidia-pytriton: backends still to copy before starting
    admin_key: str = ""  # unlocks the restricted APIs; never printed
    admin_key_shown: str = ""
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        text = shell_line(self.argv, self.env)
        return text.replace(self.admin_key, self.admin_key_shown) if self.admin_key else text

    def prepare_plain(self) -> None:
        """Make the backend directory `plain` names (nvidia-pytriton only)."""
        if self.plain_backends is not None:
            prepare_cached_backends(self.plain_backends)


@dataclass(frozen=True)
class ServedRepository:
    """A model repository as serve reads it, once: its path and record (None: not written by trt-spec, served as one
    process loading every model)."""

    path: Path
    record: Optional[RepoRecord]

    @staticmethod
    def load(repo: Path) -> "ServedRepository":
        """ServerError for a missing repository, a build directory, missing LLM-API sources, or a bad record."""
        repo = Path(repo).resolve()
        if not repo.is_dir():
            raise ServerError(
                f"{repo}: model repository not found; write one with `trt-spec repo BUILD_DIR --out {repo}`"
            )
        if (repo / "manifest.json").is_file() and not (repo / REPO_META).is_file():
            raise ServerError(
                f"{repo} is a build directory, not a model repository; write one from it, then serve "
                f"that: trt-spec repo {repo} --out {repo / 'repo'} && trt-spec serve {repo / 'repo'}"
            )
        from ..repository.llmapi import missing_sources

        missing = missing_sources(repo)
        if missing:
            raise ServerError(missing[0])
        try:
            return ServedRepository(repo, RepoRecord.read(repo))
        except ManifestError as e:
            raise ServerError(str(e)) from None

    @property
    def runtime(self) -> Optional[Runtime]:
        return self.record.deployment.runtime if self.record else None

    @property
    def llmapi(self) -> bool:
        return self.runtime is Runtime.LLMAPI

    @property
    def mpi_singleton(self) -> bool:
        """One tritonserver under `mpirun -n 1`: runtime llmapi on GPUs, as NVIDIA launches its LLM-API model
        (upstream-facts: trtllm-llmapi-launch-mpirun)."""
        d = self.record.deployment if self.record else None
        return bool(d and d.runtime is Runtime.LLMAPI and d.gpu)

    @property
    def mpi_ranks(self) -> int:
        return self.record.mpi_ranks if self.record else 1

    @property
    def orchestrator(self) -> bool:
        return bool(self.record and self.record.orchestrator)

    @property
    def gpu_ids(self) -> list[int]:
        return list((self.record.gpu_ids if self.record else None) or [0])

    @property
    def launch_models(self) -> list[str]:
        """The models the launch loads by name when the repository has phase-only models; [] (every model) else."""
        r = self.record
        return list(r.load_models) if r is not None and r.phase_models else []

    def engine_bytes(self) -> int:
        """Bytes of weights the launch loads (engines; runtime llmapi: the directories model.yaml names); 0 without a
        record."""
        if self.record is None:
            return 0
        total = 0
        for d, sums in self.record.engines.items():
            total += sum(int(f.get("size", 0)) for f in sums.files.values()) if sums.files else _dir_bytes(d)
        if self.runtime is Runtime.LLMAPI:
            import yaml

            from ..records import llmapi_contract as lc

            for name in self.record.load_models or []:
                f = self.path / name / "1" / lc.YAML_FILE
                y = (yaml.safe_load(f.read_text()) or {}) if f.is_file() else {}
                dirs = [y.get("model"), (y.get("speculative_config") or {}).get(lc.SPEC_MODEL_DIR)]
                total += sum(_dir_bytes(d) for d in dirs if isinstance(d, str) and os.path.isdir(d))
        return total

    def ready_timeout_s(self) -> float:
        """serve's default ready timeout, in seconds; on a GPU the LLM API adds start-up work after the weights."""
        d = self.record.deployment if self.record else None
        llmapi_gpu = bool(d and d.runtime is Runtime.LLMAPI and d.gpu)
        return defaults.ready_timeout_s(self.engine_bytes()) + (defaults.LLMAPI_READY_EXTRA_S if llmapi_gpu else 0.0)


@dataclass(frozen=True)
class _Ranks:
    """What every rank's argv is made of, for serve's launch or (plain=True) the plain one."""

    binary: Path
    repo: Path
    world: int
    orchestrator: bool
    mpi_singleton: bool
    gpu_ids: list[int]
    loads: list[str]  # [] = every model (--load-model=*)
    backend_args: list[str]
    plain_backend_args: list[str]
    shm_prefix: str
    serving_args: list[str]  # rank 0 of serve's launch only

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
        elif plain and self.loads:  # phase-only models must not load at start
            a += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in self.loads)]
        elif not plain:
            # explicit mode so that serve can drain (TritonServer.drain); models by name when some are phase-only
            # (upstream-facts: triton-load-model-star-exclusive)
            a += ["--model-control-mode=explicit", *([f"--load-model={m}" for m in self.loads] or ["--load-model=*"])]
            a += self.serving_args
        return a

    def processes(self, plain: bool) -> list[str]:
        if self.orchestrator or self.mpi_singleton:
            return ["mpirun", "--allow-run-as-root", "-n", "1", *self.rank_args(0, plain)]
        if self.world == 1:
            return self.rank_args(0, plain)
        argv = ["mpirun", "--allow-run-as-root"]
        for rank in range(self.world):
            argv += ["-n", "1", *self.rank_args(rank, plain)] + ([":"] if rank < self.world - 1 else [])
        return argv


def _backends(binary: Path, workdir: Optional[Path], prepare: bool):
    """(backend args, env, notes, work dir left to prepare); nvidia-pytriton's binary needs its backends copied."""
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
    served: ServedRepository,
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
    shm_prefix: Optional[str] = None,
) -> LaunchSpec:
    """The exact command line(s) for `served` (which need not exist here, e.g. a pod's).

    Without a workdir nvidia-pytriton's backends go to a placeholder WORKDIR; admin_key defaults to a random key.
    """
    repo, world, orchestrator = served.path, served.mpi_ranks, served.orchestrator
    gpu_ids, loads = served.gpu_ids, served.launch_models
    binary = binary or find_tritonserver()
    if binary is None:
        raise ServerError("tritonserver not found; use the NGC image or `pip install 'trt-spec[serve]'`")
    backend_args, env, notes, spec_workdir = _backends(binary, workdir, prepare)
    if orchestrator:
        # two TRT-LLM models with TP/PP > 1 (upstream-facts: trtllm-orchestrator-multi-model)
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
    # the plain launch: ranks get launch_triton_server.py's shm prefixes (upstream-facts: trtllm-launch-shm-prefix)
    plain_backends = plain_backends_dir() if backend_args else None
    ranks = _Ranks(
        binary,
        repo,
        world,
        orchestrator,
        served.mpi_singleton,
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
    """The plain launch of a written repository as `trt-spec repo` prints it, backends prepared; None without a
    tritonserver."""
    try:
        spec = launch_spec(ServedRepository.load(repo), binary=NGC_TRITONSERVER if engine == "tensorrt" else None)
        spec.prepare_plain()
    except ServerError:
        return None
    return spec.plain


def _dir_bytes(d: str) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
