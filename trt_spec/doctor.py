"""`trt-spec doctor`: what is present on this machine and what each missing piece blocks."""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

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


# Provided by the Triton python backend's stub at run time: never importable outside tritonserver.
STUB_MODULES = {"triton_python_backend_utils"}


def model_sources() -> Path:
    """The python models trt-spec deploys: trt_spec.model_repo when installed, else the checkout's model_repo/ (as
    serve.repository.model_repo_sources, without importing the repository writer and its protobuf dependencies)."""
    from importlib.util import find_spec

    spec = find_spec("trt_spec.model_repo")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[1] / "model_repo"


def served_imports(root: Optional[Path] = None) -> dict[str, dict[str, set[str]]]:
    """What the python models import, read from their source with ast (module level and inside functions): module ->
    {model -> names imported from it (empty for `import module`)}. The standard library and the stub's own module
    are left out; relative imports do not occur in a Triton model."""
    out: dict[str, dict[str, set[str]]] = {}
    for f in sorted((root or model_sources()).glob("*/1/model.py")):
        model = f.parent.parent.name
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                pairs = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in pairs:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in STUB_MODULES:
                    continue
                names = out.setdefault(module, {}).setdefault(model, set())
                if name is not None and name != "*":
                    names.add(name)
    return out


def import_error(module: str, names: Iterable[str] = ()) -> Optional[str]:
    """None when `module` imports in this interpreter (and has `names`, as `from module import name` needs), else the
    error on one line."""
    try:
        mod = importlib.import_module(module)
        for name in sorted(names):
            if not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # a submodule: from package import module
    except Exception as e:  # noqa: BLE001 (an import can raise anything: ABI, version checks, missing libraries)
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first}"
    return None


def served_import_checks(root: Optional[Path] = None) -> list[Check]:
    """One line per module the served python models import that this interpreter (the one tritonserver's python
    backend runs: the image's python3) cannot import; one ok line when all import."""
    imports = served_imports(root)
    bad = []
    for module, by_model in sorted(imports.items()):
        err = import_error(module, set().union(*by_model.values()))
        if err is not None:
            bad.append(Check(f"import {module}", False, err, f"the python model(s) {', '.join(sorted(by_model))}"))
    if bad:
        return bad
    return [Check("served imports", True, f"the python models' {len(imports)} imports all load in {sys.executable}",
                  "")]


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
    tc_err = import_error("tritonclient.grpc")  # its generated protobuf/grpc code checks the runtime versions at import
    checks.append(Check("tritonclient", tcv is not None and tc_err is None,
                        (f"{tcv}, but import tritonclient.grpc fails: {tc_err}" if tc_err and tcv else
                         tcv or "not installed (make gpu-setup; pip install '.[serve]' on CPU)"),
                        "trt-spec repo / check / bench (tritonclient.grpc)"))
    checks += served_import_checks()
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
