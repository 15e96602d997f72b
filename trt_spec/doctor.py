"""`trt-spec doctor`: what is present on this machine and what each missing piece blocks."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .records.config import Toolchain
from .build.hardware import detect_gpus
from .serve.server import find_tritonserver, python_backend_stub
from .build import trtllm
from .build.trtllm import NGC_IMAGE, TRTLLM_VERSION, trtllm_mismatch


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    blocks: str  # what cannot be done without it
    fatal: bool = False  # wrong, not merely missing: `trt-spec doctor` exits 1


def run_checks(toolchain: Toolchain | None = None, disk_path: Path = Path(".")) -> list[Check]:
    tc = toolchain or Toolchain()
    checks: list[Check] = []
    gpu = detect_gpus()
    checks.append(Check("GPU", gpu is not None, gpu.describe() if gpu else "no nvidia-smi / no GPU",
                        "engine: tensorrt builds and serving (plan still works with --gpu NAME)"))
    trt = trtllm.dist_version("tensorrt_llm")
    mismatch = trtllm_mismatch(trt)
    checks.append(Check("TensorRT-LLM", trt is not None and mismatch is None,
                        mismatch or (f"{trt} (trt-spec targets {TRTLLM_VERSION})" if trt else
                                     f"not installed (run in {NGC_IMAGE})"),
                        "engine: tensorrt builds and serving (trt-spec build, the tensorrtllm backend)",
                        fatal=mismatch is not None))
    tb = shutil.which(tc.trtllm_build)
    checks.append(Check("trtllm-build", tb is not None, tb or f"{tc.trtllm_build} not on PATH", "engine builds"))
    qp = Path(tc.examples_dir) / "quantization" / "quantize.py"
    checks.append(Check("quantize.py", qp.is_file(), str(qp) if qp.is_file() else f"{qp} missing "
                        "(set toolchain.examples_dir)", "FP8/INT8/INT4 quantization steps"))
    ts = find_tritonserver()
    checks.append(Check("tritonserver", ts is not None, str(ts) if ts else "not found (pip install '.[serve]')",
                        "trt-spec serve"))
    stub = python_backend_stub()
    checks.append(Check("python-backend stub", stub is not None,
                        str(stub) if stub else f"no stub for Python {sys.version_info.major}.{sys.version_info.minor}",
                        "python-backend models (preprocessing, BLS, reference engine)"))
    tcv = trtllm.dist_version("tritonclient")
    checks.append(Check("tritonclient", tcv is not None, tcv or "not installed", "trt-spec check / bench"))
    for dist, blocks in (("torch", "engine: reference (CPU)"), ("transformers", "tokenizers in preprocessing")):
        v = trtllm.dist_version(dist)
        checks.append(Check(dist, v is not None, v or "not installed (pip install '.[reference]')", blocks))
    np_v = trtllm.dist_version("numpy")
    np_ok = np_v is not None and int(np_v.split(".")[0]) < 2
    checks.append(Check("numpy<2", np_ok, np_v or "not installed", "Triton 2.51 python backend (numpy 2 breaks it)"))
    usage = shutil.disk_usage(disk_path if disk_path.exists() else Path("/"))
    free_gib = usage.free / 1024**3
    checks.append(Check("disk", free_gib >= 20, f"{free_gib:.0f} GiB free at {disk_path.resolve()}",
                        "engine builds (a 70B FP8 build needs ~150 GiB for checkpoints + engines)"))
    return checks
