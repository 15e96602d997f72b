"""GPU facts: detection with nvidia-smi, or a named GPU given by the config / `--gpu`."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ..errors import TrtSpecError


class HardwareError(TrtSpecError, ValueError):
    """Unknown GPU name or unusable nvidia-smi output."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    compute_capability: tuple[int, int]
    memory_gib: float
    count: int
    source: str  # "nvidia-smi" | "config"

    @property
    def sm(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def has_fp8(self) -> bool:
        """FP8 tensor cores: Ada (SM89), Hopper (SM90), Blackwell (SM100+)."""
        return self.sm >= 89

    def describe(self) -> str:
        cc = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        return (
            f"{self.count}x {self.name} (SM {cc}, {self.memory_gib:.0f} GiB, "
            f"FP8 {'yes' if self.has_fp8 else 'no'}, from {self.source})"
        )


# name -> (compute capability, memory GiB as nvidia-smi reports it / 1024)
KNOWN_GPUS: dict[str, tuple[tuple[int, int], float]] = {
    "h100": ((9, 0), 79.6),
    "h100-sxm": ((9, 0), 79.6),
    "h100-pcie": ((9, 0), 79.6),
    "h100-nvl": ((9, 0), 93.6),
    "h200": ((9, 0), 140.4),
    "h20": ((9, 0), 95.6),
    "gh200": ((9, 0), 94.5),
    "b200": ((10, 0), 179.1),
    "gb200": ((10, 0), 184.0),
    "l40s": ((8, 9), 45.0),
    "l40": ((8, 9), 45.0),
    "l4": ((8, 9), 22.5),
    "rtx-4090": ((8, 9), 23.6),
    "rtx-6000-ada": ((8, 9), 47.5),
    "a100-80gb": ((8, 0), 80.0),
    "a100-40gb": ((8, 0), 40.0),
    "a100": ((8, 0), 80.0),
    "a10g": ((8, 6), 22.5),
    "a10": ((8, 6), 22.5),
    "a6000": ((8, 6), 47.5),
    "v100": ((7, 0), 32.0),
    "t4": ((7, 5), 15.0),
}


@dataclass(frozen=True)
class GpuRates:
    """A GPU's datasheet HBM bandwidth and dense tensor-core peaks; fp8_tflops 0 where the GPU has no FP8."""

    bandwidth_tb_s: float
    fp8_tflops: float
    bf16_tflops: float
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100); modal.com/gpu-glossary"
# fmt: off
# name -> bandwidth TB/s, dense FP8 / BF16 TFLOPS (sparse figures halved), source
GPU_RATES: dict[str, GpuRates] = {
    "h100": GpuRates(3.35, 1979, 989, _H100 + " (SXM)"),
    "h100-sxm": GpuRates(3.35, 1979, 989, _H100 + " (SXM)"),
    "h100-pcie": GpuRates(2.0, 1513, 756, _H100 + " (PCIe)"),
    "h100-nvl": GpuRates(3.9, 1671, 835, _H100 + " (NVL)"),
    "h200": GpuRates(4.8, 1979, 989, "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), SXM"),
    "h20": GpuRates(4.0, 296, 148, "NVIDIA H20 product brief (HGX H20)"),
    "gh200": GpuRates(4.0, 1979, 989, "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3)"),
    "b200": GpuRates(8.0, 4500, 2250, "NVIDIA DGX B200 datasheet, per GPU; modal.com/gpu-glossary"),
    "gb200": GpuRates(8.0, 5000, 2500, "NVIDIA GB200 NVL72 datasheet, per GPU"),
    "l40s": GpuRates(0.864, 733, 362, "NVIDIA L40S datasheet"),
    "l40": GpuRates(0.864, 362, 181, "NVIDIA L40 datasheet"),
    "l4": GpuRates(0.3, 242, 121, "NVIDIA L4 Tensor Core GPU datasheet"),
    "rtx-4090": GpuRates(1.008, 330, 165, "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090)"),
    "rtx-6000-ada": GpuRates(0.96, 364, 182, "NVIDIA RTX 6000 Ada Generation datasheet"),
    "a100-80gb": GpuRates(2.039, 0, 312, "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM); modal.com/gpu-glossary"),
    "a100-40gb": GpuRates(1.555, 0, 312, "NVIDIA A100 Tensor Core GPU datasheet (40 GB SXM)"),
    "a100": GpuRates(2.039, 0, 312, "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM)"),
    "a10g": GpuRates(0.6, 0, 70, "AWS EC2 G5 (NVIDIA A10G) specifications"),
    "a10": GpuRates(0.6, 0, 125, "NVIDIA A10 Tensor Core GPU datasheet"),
    "a6000": GpuRates(0.768, 0, 155, "NVIDIA RTX A6000 datasheet"),
    "v100": GpuRates(0.9, 0, 125, "NVIDIA V100 Tensor Core GPU datasheet (SXM2, FP16 tensor)"),
    "t4": GpuRates(0.32, 0, 65, "NVIDIA T4 Tensor Core GPU datasheet (FP16 tensor)"),
}
# fmt: on


def gpu_rates(name: str) -> GpuRates:
    """GPU_RATES[name]; a HardwareError naming the GPUs with figures."""
    if name not in GPU_RATES:
        raise HardwareError(
            f"no bandwidth/FLOPS figures for GPU {name!r}; plan for one of {', '.join(sorted(GPU_RATES))} "
            "(--gpu NAME:COUNT) to get a performance prediction"
        )
    return GPU_RATES[name]


DEFAULT_NAMED_COUNT = 8  # a named GPU without ":COUNT" is assumed to be an 8-GPU node


def named_gpu(spec: str, source: str = "config") -> GpuSpec:
    """`h100`, `h200:1`, `a100-80gb:4` -> GpuSpec (no count: an 8-GPU node); raises HardwareError."""
    name, _, count_s = spec.strip().lower().partition(":")
    if name not in KNOWN_GPUS:
        raise HardwareError(
            f"unknown GPU {name!r}; use one of {', '.join(sorted(KNOWN_GPUS))} (optionally NAME:COUNT) or 'auto'"
        )
    try:
        count = int(count_s) if count_s else DEFAULT_NAMED_COUNT
    except ValueError:
        raise HardwareError(f"GPU count in {spec!r} must be an integer, e.g. h100:2") from None
    if count < 1:
        raise HardwareError(f"GPU count in {spec!r} must be >= 1")
    cc, mem = KNOWN_GPUS[name]
    if not count_s:
        source = f"{source}: {name} names no count, an {DEFAULT_NAMED_COUNT}-GPU node assumed ({name}:COUNT says)"
    return GpuSpec(name=name, compute_capability=cc, memory_gib=mem, count=count, source=source)


def _canonical_name(smi_name: str) -> str:
    n = smi_name.lower().replace("nvidia ", "").strip()
    for key in (
        "h200",
        "h100 nvl",
        "h100",
        "gh200",
        "h20",
        "b200",
        "gb200",
        "l40s",
        "l40",
        "l4",
        "a100",
        "a10g",
        "a10",
    ):
        if key in n:
            return key.replace(" ", "-")
    return n.replace(" ", "-")


def parse_nvidia_smi(csv_text: str) -> GpuSpec:
    """Parse `nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits`."""
    rows = [r for r in (line.strip() for line in csv_text.splitlines()) if r]
    if not rows:
        raise HardwareError("nvidia-smi listed no GPUs; pass --gpu NAME to plan for a named GPU")
    parsed = []
    for r in rows:
        parts = [p.strip() for p in r.split(",")]
        if len(parts) != 3:
            raise HardwareError(f"unexpected nvidia-smi line {r!r}; pass --gpu NAME instead")
        name, cc, mem = parts
        major, _, minor = cc.partition(".")
        parsed.append((name, (int(major), int(minor or 0)), float(mem) / 1024.0))
    name, cc, mem = parsed[0]
    # Mixed nodes: plan for the smallest GPU.
    mem = min(p[2] for p in parsed)
    return GpuSpec(
        name=_canonical_name(name), compute_capability=cc, memory_gib=mem, count=len(parsed), source="nvidia-smi"
    )


def detect_gpus(timeout: float = 10.0) -> GpuSpec | None:
    """GPUs of this host via nvidia-smi, or None when there is no nvidia-smi / no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return parse_nvidia_smi(out.stdout)


def resolve_gpu(config_gpu: str, override: str | None = None) -> GpuSpec | None:
    """The GPU the plan targets: --gpu override, else the config's `gpu`, else nvidia-smi; None if unknown.

    `--gpu NAME` without a count takes the config's count for the same GPU, else raises HardwareError."""
    config_gpu = (config_gpu or "auto").strip().lower()
    if override:
        name, _, count = override.strip().lower().partition(":")
        if count or name == "auto":
            return named_gpu(override, "--gpu") if name != "auto" else detect_gpus()
        c_name, _, c_count = config_gpu.partition(":")
        if c_name == name and c_count:
            return named_gpu(f"{name}:{c_count}", f"--gpu {name}, count from the config's gpu: {config_gpu}")
        named_gpu(name)  # an unknown name is that error first
        raise HardwareError(
            f"--gpu {name} names no GPU count and the config plans for gpu: {config_gpu}; say how "
            f"many: --gpu {name}:COUNT (e.g. {name}:1)"
        )
    if config_gpu != "auto":
        return named_gpu(config_gpu, "config")
    return detect_gpus()
