"""Whether an unloaded model's processes gave its GPU memory back, read with NVML before the next phase's model loads.

Triton lists a model as unloaded when its python backend is finalized, but the LLM API's worker processes may still
hold the memory; the next model then fails to load or sizes its KV cache from what is left
(upstream-facts: triton-unload-async). The rule: every GPU of the repository has at least the next model's need free,
as the repository's memory plan counts it (weights + KV cache for max_batch_size full sequences + reserve per GPU,
what `trt-spec repo` checked that phase against), less GPU_MEMORY_SLACK_GIB. The used memory before the unloaded model
loaded is no rule here: the speculative model loaded at launch, before any client could read it.

NVML (nvidia-ml-py) is imported lazily; the check runs only for a server on this host whose process is visible here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..records import defaults
from ..records.memory import GIB, instance_rows
from ..records.names import LOCAL_HOSTS
from .errors import ServerError
from .watchdog import cmdline, environ

MIB = 2**20
TCP_LISTEN = "0A"  # /proc/net/tcp st of a listening socket


def listening_pid(port: int, proc: Path = Path("/proc")) -> Optional[int]:
    """The pid of the process listening on TCP `port` on this host, or None (not listening, or not visible here)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == TCP_LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for p in proc.iterdir():
        if not p.name.isdigit():
            continue
        try:
            fds = list((p / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return int(p.name)
            except OSError:
                pass
    return None


def process_name(pid: int) -> str:
    """The process's name from /proc (comm), or why there is none."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "not visible on this host"


def model_need_gib(repo: Path, model: str) -> dict[int, float]:
    """The planned GiB per GPU (ordinal among the server's visible GPUs) of one runtime-llmapi model of the
    repository; {} on a CPU deployment."""
    import yaml

    from ..records import llmapi_contract as lc
    from ..records.manifest import RepoRecord
    from ..repository.memory import llmapi_instances

    record = RepoRecord.read(repo)
    if record is None or not record.deployment.gpu:
        return {}
    d = record.deployment
    y = yaml.safe_load((repo / model / "1" / lc.YAML_FILE).read_text()) or {}
    need: dict[int, float] = {}
    for inst in llmapi_instances(d, {model: y}):
        for r in instance_rows(inst, d.limits, d.placement.memory_reserve_gib):
            need[r.gpu_id] = need.get(r.gpu_id, 0.0) + r.total_gib
    return need


def _nvml():
    """pynvml, initialised; raises ImportError or pynvml.NVMLError."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


@dataclass
class GpuMemoryGate:
    """The GPUs of one local server's repository, read with NVML; wait() after each phase unload."""

    nvml: object  # the pynvml module, initialised
    repo: Path
    server_pid: int
    devices: list[str]  # the server's visible GPUs (CUDA_VISIBLE_DEVICES entries, or NVML indices)

    @staticmethod
    def for_server(url: str) -> "tuple[Optional[GpuMemoryGate], str]":
        """(gate, "") for a GPU llmapi server on this host with NVML; else (None, why the check is skipped)."""
        host, _, port = url.replace("http://", "").rstrip("/").rpartition(":")
        if host not in LOCAL_HOSTS and not host.startswith("127.") or not port.isdigit():
            return None, f"the server ({url}) is not on this host"
        pid = listening_pid(int(port))
        if pid is None:
            return None, f"no process listening on port {port} is visible on this host (another container?)"
        repo = next((a.split("=", 1)[1] for a in cmdline(pid) if a.startswith("--model-repository=")), None)
        if repo is None:
            return None, f"process {pid} on port {port} names no --model-repository"
        from ..errors import TrtSpecError
        from ..records import llmapi_contract as lc

        try:
            need = model_need_gib(Path(repo), lc.BASELINE_MODEL)
        except (OSError, ValueError, TrtSpecError) as e:
            return None, f"the repository {repo} has no readable memory plan ({e})"
        if not need:
            return None, f"the repository {repo} is served on CPU"
        try:
            nvml = _nvml()
        except ImportError:
            return None, "NVML is not installed here (pip install nvidia-ml-py)"
        except Exception as e:  # noqa: BLE001 - pynvml.NVMLError: no driver, no library
            return None, f"NVML is unavailable here ({e})"
        visible = environ(pid).get("CUDA_VISIBLE_DEVICES")
        devices = [v.strip() for v in visible.split(",")] if visible else []
        return GpuMemoryGate(nvml, Path(repo), pid, devices), ""

    def _handle(self, ordinal: int):
        n = self.nvml
        if not self.devices:
            return n.nvmlDeviceGetHandleByIndex(ordinal), str(ordinal)
        dev = self.devices[ordinal]
        if dev.isdigit():
            return n.nvmlDeviceGetHandleByIndex(int(dev)), dev
        return n.nvmlDeviceGetHandleByUUID(dev), dev

    def free_gib(self, ordinal: int) -> float:
        handle, _ = self._handle(ordinal)
        return self.nvml.nvmlDeviceGetMemoryInfo(handle).free / GIB

    def holders(self, ordinal: int) -> list[str]:
        """`pid PID (NAME) N MiB` of each compute process on the GPU, largest first."""
        handle, _ = self._handle(ordinal)
        procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        procs = sorted(procs, key=lambda p: -(p.usedGpuMemory or 0))
        return [
            f"pid {p.pid} ({process_name(p.pid)}) "
            + (f"{p.usedGpuMemory / MIB:.0f} MiB" if p.usedGpuMemory is not None else "memory not reported")
            for p in procs
        ]

    def wait(
        self,
        unloaded: str,
        next_model: str,
        wait_s: Optional[float] = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Return once every GPU has next_model's planned need free; ServerError naming the holders after wait_s
        (default GPU_MEMORY_WAIT_S)."""
        wait_s = defaults.GPU_MEMORY_WAIT_S if wait_s is None else wait_s
        need = model_need_gib(self.repo, next_model)
        deadline = clock() + wait_s
        while True:
            free = {g: self.free_gib(g) for g in need}
            short = {g: (free[g], n) for g, n in need.items() if free[g] < n - defaults.GPU_MEMORY_SLACK_GIB}
            if not short:
                return
            if clock() >= deadline:
                break
            sleep(defaults.GPU_MEMORY_POLL_S)
        g, (free, n) = next(iter(sorted(short.items())))
        _, dev = self._handle(g)
        held = "; ".join(self.holders(g)) or "no compute process listed"
        raise ServerError(
            f"GPU {dev} still has only {free:.1f} GiB free {wait_s:.0f}s after {unloaded} unloaded, and "
            f"{next_model} needs {n:.1f} GiB there (the repository's memory plan); held by: {held}; stop the "
            f"unloaded model's leftover processes (kill PID) or restart `trt-spec serve`, then run again"
        )

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing to do about a failed shutdown
            pass
