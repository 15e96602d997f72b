"""An NVML double: exactly the pynvml (nvidia-ml-py 13.x) functions trt_spec/serve/gpu_memory.py calls, with their
names, arguments and return shapes, over GPUs whose memory a test sets (and may change on a schedule)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Optional

NVML_ERROR_INVALID_ARGUMENT = 2  # pynvml's codes
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12


class NVMLError(Exception):
    """pynvml.NVMLError(value): .value is the NVML return code."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        known = {NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}
        return known.get(self.value, f"NVML error {self.value}")


class Gpu:
    def __init__(self, total: int, used: int, uuid: str, procs: Optional[list[tuple[int, Optional[int]]]] = None):
        self.total, self.used, self.uuid = total, used, uuid
        self.procs = procs or []  # (pid, bytes or None)


class FakeNvml:
    """Install with monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...)). on_read(nvml) runs before each memory
    read, so a test can release memory over time."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[Gpu], init_error: Optional[int] = None, on_read: Callable[["FakeNvml"], None] = None):
        self.gpus, self.init_error, self.on_read = gpus, init_error, on_read
        self.initialised = 0
        self.reads = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if self.initialised == 0:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED
        self.initialised -= 1

    def _live(self) -> None:
        if self.initialised == 0:
            raise NVMLError(1)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._live()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str):
        self._live()
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        """c_nvmlMemory_t: total, free, used in bytes."""
        self._live()
        self.reads += 1
        if self.on_read is not None:
            self.on_read(self)
        return SimpleNamespace(total=handle.total, free=handle.total - handle.used, used=handle.used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        """c_nvmlProcessInfo_t objects: pid, usedGpuMemory (bytes, None when not reported), gpuInstanceId,
        computeInstanceId."""
        self._live()
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in handle.procs
        ]
