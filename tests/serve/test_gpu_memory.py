"""After a phase unload (runtime llmapi), the next model loads only once its planned GPU memory is free again
(serve/gpu_memory.py, harness/phases.py): NVML is an NVML double; the repository is a real GPU llmapi repository
written by trt-spec repo, served "by" a real listening process whose argv names it, as tritonserver's does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trt_spec.harness import phases
from trt_spec.records import defaults
from trt_spec.records import llmapi_contract as lc
from trt_spec.serve.errors import ServerError
from trt_spec.serve.gpu_memory import GpuMemoryGate, listening_pid, model_need_gib, process_name

from ..conftest import REPO
from .nvml_double import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml, Gpu

GIB, MIB = 2**30, 2**20
CONFIG = REPO / "build_configs" / "llama31-8b-ngram-llmapi-h100.yaml"
LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True); time.sleep(120)\n"
)


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    """The H100 8B n-gram llmapi repository `trt-spec repo` writes (NVIDIA's model.py replaced by an empty file)."""
    from trt_spec.builder.pipeline import manifest_for_config
    from trt_spec.repository.writer import write_repository

    tmp = tmp_path_factory.mktemp("gpu-repo")
    src = tmp / "nvidia" / "1"
    src.mkdir(parents=True)
    (src / "model.py").write_text("\n")
    m = manifest_for_config(CONFIG, [f"toolchain.llmapi_model_dir={src}"])
    write_repository(m, tmp / "repo")
    return tmp / "repo"


@pytest.fixture
def server(gpu_repo):
    """A process listening on a loopback port with `--model-repository=REPO` in its argv; (url, pid)."""
    made = []

    def start(visible: str | None = None):
        env = {"PATH": "/usr/bin:/bin", **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
        p = subprocess.Popen(
            [sys.executable, "-c", LISTEN, f"--model-repository={gpu_repo}"], stdout=subprocess.PIPE, env=env, text=True
        )
        made.append(p)
        port = int(p.stdout.readline())
        return f"127.0.0.1:{port}", p.pid

    yield start
    for p in made:
        p.kill()
        p.wait()


def install(monkeypatch, nvml) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(defaults, "GPU_MEMORY_POLL_S", 0.01)


def test_the_need_is_the_baselines_planned_weights_kv_and_reserve(gpu_repo):
    need = model_need_gib(gpu_repo, lc.BASELINE_MODEL)
    assert list(need) == [0] and 16 < need[0] < 80  # 8B bf16 weights (~15 GiB) + KV + reserve, on one H100


def test_memory_that_comes_back_lets_the_next_model_load(monkeypatch, server):
    url, _ = server()
    gpu = Gpu(80 * GIB, 78 * GIB, "GPU-a")

    def release(nvml):  # the unloaded model's workers exit on the third read
        if nvml.reads >= 3:
            gpu.used = 1 * GIB

    nvml = FakeNvml([gpu], on_read=release)
    install(monkeypatch, nvml)
    gate, why = GpuMemoryGate.for_server(url)
    assert why == "" and gate is not None
    gate.wait(lc.MODEL_NAME, lc.BASELINE_MODEL)
    assert nvml.reads >= 3
    gate.close()
    assert nvml.initialised == 0


def test_memory_still_held_is_one_line_naming_the_holder(monkeypatch, server):
    url, pid = server()
    gone = 2**22 + 12345  # a pid no process here has
    nvml = FakeNvml([Gpu(80 * GIB, 78 * GIB, "GPU-a", [(pid, 70 * GIB), (gone, None)])])
    install(monkeypatch, nvml)
    gate, _ = GpuMemoryGate.for_server(url)
    with pytest.raises(ServerError) as e:
        gate.wait(lc.MODEL_NAME, lc.BASELINE_MODEL, wait_s=0.05)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("GPU 0 still has only 2.0 GiB free 0s after tensorrt_llm unloaded, and tensorrt_llm_base")
    held = f"held by: pid {pid} ({process_name(pid)}) 71680 MiB; pid {gone} (not visible on this host) memory not"
    assert held in line
    assert process_name(pid).startswith("python")
    assert "kill PID" in line and "restart `trt-spec serve`" in line


def test_the_gpus_are_the_servers_visible_ones(monkeypatch, server):
    """CUDA_VISIBLE_DEVICES=1: the LLM API's first GPU is NVML's GPU 1; GPU 0 being full does not matter."""
    url, _ = server(visible="1")
    install(monkeypatch, FakeNvml([Gpu(80 * GIB, 80 * GIB, "GPU-a"), Gpu(80 * GIB, 1 * GIB, "GPU-b")]))
    gate, _ = GpuMemoryGate.for_server(url)
    gate.wait(lc.MODEL_NAME, lc.BASELINE_MODEL, wait_s=0)
    url, _ = server(visible="GPU-a")  # by UUID: the full one
    gate, _ = GpuMemoryGate.for_server(url)
    with pytest.raises(ServerError, match="^GPU GPU-a still has only 0.0 GiB free"):
        gate.wait(lc.MODEL_NAME, lc.BASELINE_MODEL, wait_s=0)


def test_without_nvml_or_a_local_server_the_check_is_skipped_with_the_reason(monkeypatch, server):
    url, _ = server()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert GpuMemoryGate.for_server(url) == (None, "NVML is not installed here (pip install nvidia-ml-py)")
    install(monkeypatch, FakeNvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND))  # no driver library
    assert GpuMemoryGate.for_server(url) == (None, "NVML is unavailable here (NVML Shared Library Not Found)")
    assert GpuMemoryGate.for_server("gpu-node-7:8001") == (None, "the server (gpu-node-7:8001) is not on this host")
    port = int(url.rpartition(":")[2])
    assert listening_pid(port) is not None
    free = next(p for p in range(port + 1, port + 200) if listening_pid(p) is None)
    assert GpuMemoryGate.for_server(f"127.0.0.1:{free}")[1].startswith(f"no process listening on port {free}")


class Client:
    def __init__(self, url):
        self.url = url


class Control:
    """Triton's repository API as phases.py uses it; records the calls in order with the GPU's state."""

    def __init__(self, gpu: Gpu, release_on_unload: bool, url: str = ""):
        self.gpu, self.release, self.client = gpu, release_on_unload, Client(url)
        self.calls: list[str] = []
        self.loaded = {lc.MODEL_NAME}

    def unload(self, name):
        self.calls.append(f"unload {name}")
        self.loaded.discard(name)
        if self.release:
            self.gpu.used = 1 * GIB

    def load(self, name):
        self.calls.append(f"load {name} at {self.gpu.used // GIB} GiB used")
        self.loaded.add(name)
        self.gpu.used = 70 * GIB

    def state(self, name):
        return "READY" if name in self.loaded else "UNAVAILABLE"


def test_the_phase_switch_waits_for_the_memory_and_stops_before_loading_into_a_full_gpu(monkeypatch, server):
    url, pid = server()
    gpu = Gpu(80 * GIB, 70 * GIB, "GPU-a", [(pid, 69 * GIB)])
    install(monkeypatch, FakeNvml([gpu]))
    notes: list[str] = []
    ctl = Control(gpu, release_on_unload=True, url=url)
    with phases.baseline_phase(Client(url), ctl, notes.append):
        pass
    assert ctl.calls == [
        "unload tensorrt_llm",
        "load tensorrt_llm_baseline at 1 GiB used",
        "unload tensorrt_llm_baseline",
        "load tensorrt_llm at 1 GiB used",
    ]
    assert not any("GPU-memory" in n for n in notes)

    monkeypatch.setattr(defaults, "GPU_MEMORY_WAIT_S", 0.05)
    gpu.used, ctl = 70 * GIB, Control(gpu, release_on_unload=False, url=url)  # the workers keep the memory
    with pytest.raises(ServerError, match=rf"^GPU 0 still has only 10.0 GiB free .* held by: pid {pid} "):
        with phases.baseline_phase(Client(url), ctl, notes.append):
            pytest.fail("the baseline's phase must not run")
    assert ctl.calls == ["unload tensorrt_llm"]  # neither model loaded into the held memory


def test_a_server_on_cpu_or_elsewhere_is_said_once_and_switches_as_before(monkeypatch):
    notes: list[str] = []
    ctl = Control(Gpu(1, 0, "x"), release_on_unload=True)
    with phases.baseline_phase(Client("gpu-node-7:8001"), ctl, notes.append):
        pass
    assert [n for n in notes if "GPU-memory" in n] == [
        "no GPU-memory check after each unload: the server (gpu-node-7:8001) is not on this host"
    ]
    assert ctl.calls[0] == "unload tensorrt_llm" and len(ctl.calls) == 4
