"""`trt-spec doctor`: what is present on this machine and what each missing piece blocks."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from .builder import trtllm
from .builder.hardware import detect_gpus
from .builder.trtllm import NGC_IMAGE, TRTLLM_VERSION, trtllm_mismatch
from .deploy.gpu_setup import canonical
from .records.config import Toolchain
from .serve.locate import find_tritonserver, python_backend_stub


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    blocks: str  # what cannot be done without it
    fatal: bool = False  # wrong, not merely missing: exit 1


# provided by the python backend stub inside tritonserver only
STUB_MODULES = {"triton_python_backend_utils"}


def model_sources() -> Path:
    """trt_spec.model_repo when installed, else the checkout's model_repo/ (without importing protobuf code)."""
    from importlib.util import find_spec

    spec = find_spec("trt_spec.model_repo")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parents[1] / "model_repo"


def served_imports(
    root: Optional[Path] = None, files: Optional[Iterable[tuple[str, Path]]] = None
) -> dict[str, dict[str, set[str]]]:
    """Non-stdlib imports of root/*/1/model.py, or of `files` ((label, path) pairs), read with ast.

    Returns module -> {model -> names imported from it (empty for `import module`)}."""
    out: dict[str, dict[str, set[str]]] = {}
    if files is None:
        files = [(f.parent.parent.name, f) for f in sorted((root or model_sources()).glob("*/1/model.py"))]
    for model, f in files:
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
    """None when `module` (and its `names`) import here, else the error on one line."""
    try:
        mod = importlib.import_module(module)
        for name in sorted(names):
            if not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # a submodule
    except Exception as e:  # noqa: BLE001 (an import can raise anything)
        first = (str(e).strip().splitlines() or [""])[0]
        return f"{type(e).__name__}: {first}"
    return None


def served_import_checks(root: Optional[Path] = None) -> list[Check]:
    """A failed Check per module the python models import that this interpreter cannot; else one ok Check."""
    imports = served_imports(root)
    bad = []
    for module, by_model in sorted(imports.items()):
        err = import_error(module, set().union(*by_model.values()))
        if err is not None:
            bad.append(Check(f"import {module}", False, err, f"the python model(s) {', '.join(sorted(by_model))}"))
    if bad:
        return bad
    return [
        Check("served imports", True, f"the python models' {len(imports)} imports all load in {sys.executable}", "")
    ]


# -- NVIDIA's LLM-API model (runtime llmapi) and the image's TensorRT-LLM, each imported in a subprocess -------------

TRTLLM_IMPORT_TIMEOUT_S = 240.0  # importing tensorrt_llm loads torch, CUDA, MPI and TensorRT
PIP_CHECK_TIMEOUT_S = 120.0
PIP_CHECK_WATCHED = ("tensorrt-llm", "torch", "tritonclient")  # the image's packages that gpu-setup must not break
_PROBE_MARK = "TRT_SPEC_DOCTOR_PROBE "
# empty stand-ins for the stub's module, so a sibling that imports it (upstream-facts: llmapi-helpers-imports-stub)
# is checked for the rest
_PROBE_SCRIPT = """
import json, sys, types
sys.path[:0] = json.loads(sys.argv[1])
for name in json.loads(sys.argv[3]):
    sys.modules.setdefault(name, types.ModuleType(name))
from trt_spec.doctor import import_error
out = {}
for module, names in json.loads(sys.argv[2]):
    out[module] = import_error(module, names)
    print("TRT_SPEC_DOCTOR_PROBE " + json.dumps([module, out[module]]), flush=True)
"""


def probe_imports(
    modules: Iterable[tuple[str, Iterable[str]]],
    path: Iterable[Path] = (),
    timeout_s: float = TRTLLM_IMPORT_TIMEOUT_S,
    python: str = sys.executable,
) -> tuple[dict[str, Optional[str]], Optional[str], float]:
    """import_error per (module, names) in a subprocess with `path` first on sys.path, under a timeout.

    Returns ({module: error or None} for the modules reached, the subprocess's own failure or None, seconds)."""
    import json
    import subprocess
    import time

    mods = [[m, sorted(n)] for m, n in modules]
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [
                python,
                "-c",
                _PROBE_SCRIPT,
                json.dumps([str(p) for p in path]),
                json.dumps(mods),
                json.dumps(sorted(STUB_MODULES)),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        out, failure = (
            r.stdout,
            (
                None
                if r.returncode == 0
                else f"the import subprocess exited with code {r.returncode}: "
                f"{_last_line(r.stderr) or _last_line(r.stdout)}"
            ),
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        failure = f"timed out after {timeout_s:.0f}s"
    except OSError as e:
        out, failure = "", f"cannot start {python}: {e.strerror}"
    got: dict[str, Optional[str]] = {}
    for line in out.splitlines():
        if line.startswith(_PROBE_MARK):
            module, err = json.loads(line[len(_PROBE_MARK) :])
            got[module] = err
    return got, failure, time.monotonic() - t0


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def nvidia_llmapi_dir(tc: Toolchain) -> tuple[Optional[Path], list[str], Optional[str]]:
    """(NVIDIA's LLM-API model directory or None, the places looked in, why it was not looked for), as the
    repository writer finds it."""
    try:  # the writer imports tritonclient's protobuf code: a broken tritonclient is its own doctor line
        from .repository.llmapi import LLMAPI_SOURCE_CANDIDATES, llmapi_source
    except Exception as e:  # noqa: BLE001
        return None, [], f"trt_spec.repository.llmapi does not import ({type(e).__name__}: {e})"
    places = [tc.llmapi_model_dir] if tc.llmapi_model_dir else list(LLMAPI_SOURCE_CANDIDATES)
    return llmapi_source(tc.llmapi_model_dir), places, None


def nvidia_model_import_checks(
    tc: Toolchain, on_gpu_host: bool, timeout_s: float = TRTLLM_IMPORT_TIMEOUT_S
) -> list[Check]:
    """Import checks for NVIDIA's LLM-API model directory, in a subprocess; not found fails only on a GPU host."""
    d, places, why = nvidia_llmapi_dir(tc)
    blocks = "runtime: llmapi repositories (their tensorrt_llm models run NVIDIA's LLM-API model.py)"
    if d is None:
        where = why or f"looked in {', '.join(places)}; set toolchain.llmapi_model_dir"
        return [
            Check(
                "NVIDIA LLM-API model",
                not on_gpu_host,
                f"not found ({where})" + ("" if on_gpu_host else "; needed on a GPU host only"),
                blocks,
            )
        ]
    files = sorted(d.glob("*.py"))
    imports = served_imports(files=[(f.name, f) for f in files])
    got, failure, secs = probe_imports(
        [(m, set().union(*by.values())) for m, by in sorted(imports.items())], [d], timeout_s
    )
    bad = []
    for module, by_file in sorted(imports.items()):
        err = got.get(module, failure or "not imported")
        if err is not None:
            bad.append(
                Check(
                    f"import {module}",
                    False,
                    err,
                    f"NVIDIA's LLM-API model {d} ({', '.join(sorted(by_file))}): {blocks}",
                )
            )
    if bad:
        return bad
    return [
        Check(
            "NVIDIA LLM-API model",
            True,
            f"{d}: its {len(imports)} imports ({', '.join(f.name for f in files)}) "
            f"all load in {sys.executable} ({secs:.0f}s in a subprocess)",
            "",
        )
    ]


_PIP_REQ = re.compile(
    r"^(?P<who>\S+) (?P<ver>\S+) has requirement (?P<req>.+?), but you have (?P<have>\S+) "
    r"(?P<have_v>\S+?)\.?$"
)
_PIP_MISSING = re.compile(r"^(?P<who>\S+) (?P<ver>\S+) requires (?P<req>.+?), which is not installed\.?$")


def pip_check_lines(output: str) -> list[Check]:
    """A Check, with its fix, per `pip check` line naming tensorrt_llm, torch or tritonclient."""
    out = []
    for line in output.splitlines():
        line = line.strip()
        words = {canonical(w.strip(",.;()")) for w in re.split(r"[\s<>=!~,;]+", line) if w}
        hit = next((w for w in PIP_CHECK_WATCHED if w in words), None)
        if hit is None:
            continue
        m = _PIP_REQ.match(line) or _PIP_MISSING.match(line)
        if m is not None:
            req = m.group("req")
            fix = (
                f"fix: python3 -m pip install '{req}' (what {m.group('who')} {m.group('ver')} requires: the "
                "image's own version; `make gpu-setup` printed the versions it let move)"
            )
        else:
            fix = "fix: reinstall the image's pinned version of what it names"
        out.append(
            Check(
                f"pip check ({hit})",
                False,
                f"{line}; {fix}",
                "the image's TensorRT-LLM / torch / tritonclient as the image shipped them",
            )
        )
    return out


def trtllm_import_checks(
    timeout_s: float = TRTLLM_IMPORT_TIMEOUT_S,
    pip_timeout_s: float = PIP_CHECK_TIMEOUT_S,
    python: str = sys.executable,
    say: Callable[[str], None] = lambda m: None,
) -> list[Check]:
    """Where tensorrt_llm is installed: `import tensorrt_llm` in a subprocess and the relevant `pip check` lines.

    gpu-setup lets grpcio/protobuf move, and the image's TensorRT-LLM must still import."""
    import subprocess

    if trtllm.dist_version("tensorrt_llm") is None:
        return []
    say(f"doctor: importing tensorrt_llm in a subprocess (slow: torch, CUDA, MPI; up to {timeout_s:.0f}s) ...")
    got, failure, secs = probe_imports([("tensorrt_llm", ())], timeout_s=timeout_s, python=python)
    err = got.get("tensorrt_llm", failure or "not imported")
    fix = (
        "; fix: `python3 -m pip check` names what moved: put back the image's versions (the pip check lines "
        "below say which)"
    )
    checks = [
        Check(
            "import tensorrt_llm",
            err is None,
            f"imports in {secs:.0f}s (a subprocess)" if err is None else f"{err}{fix}",
            "everything on the GPU: builds, the tensorrtllm backend's python models, runtime llmapi",
        )
    ]
    try:
        r = subprocess.run(
            [python, "-m", "pip", "check"],
            capture_output=True,
            text=True,
            timeout=pip_timeout_s,
            stdin=subprocess.DEVNULL,
        )
        checks += pip_check_lines(r.stdout + "\n" + r.stderr)
    except subprocess.TimeoutExpired:
        checks.append(Check("pip check", False, f"timed out after {pip_timeout_s:.0f}s", "nothing by itself"))
    except OSError as e:
        checks.append(Check("pip check", False, f"cannot run {python} -m pip check: {e.strerror}", "nothing by itself"))
    return checks


def run_checks(
    toolchain: Toolchain | None = None, disk_path: Path = Path("."), say: Callable[[str], None] = lambda m: None
) -> list[Check]:
    """Every doctor line, in report order."""
    tc = toolchain or Toolchain()
    checks = [_gpu_check()]
    trt = trtllm.dist_version("tensorrt_llm")
    checks.append(_trtllm_check(trt))
    checks.append(_engine_path_check())
    checks += _build_tool_checks(tc)
    checks += _serving_checks()
    checks += served_import_checks()
    checks += nvidia_model_import_checks(tc, on_gpu_host=trt is not None)
    checks += trtllm_import_checks(say=say)
    checks += _package_checks()
    checks.append(_disk_check(disk_path))
    return checks


def _gpu_check() -> Check:
    gpu = detect_gpus()
    return Check(
        "GPU",
        gpu is not None,
        gpu.describe() if gpu else "no nvidia-smi / no GPU",
        "engine: tensorrt builds and serving (plan still works with --gpu NAME)",
    )


def _trtllm_check(trt: Optional[str]) -> Check:
    """A mismatch with the targeted TensorRT-LLM version is fatal."""
    mismatch = trtllm_mismatch(trt)
    return Check(
        "TensorRT-LLM",
        trt is not None and mismatch is None,
        mismatch or (f"{trt} (trt-spec targets {TRTLLM_VERSION})" if trt else f"not installed (run in {NGC_IMAGE})"),
        "engine: tensorrt builds and serving (trt-spec build, the tensorrtllm backend)",
        fatal=mismatch is not None,
    )


def _engine_path_check() -> Check:
    """Where the engine path stops: a statement, on every machine."""
    return Check("engine path", True, trtllm.ENGINE_PATH_END, "nothing: which runtime to choose")


def _build_tool_checks(tc: Toolchain) -> list[Check]:
    tb = shutil.which(tc.trtllm_build)
    qp = Path(tc.examples_dir) / "quantization" / "quantize.py"
    return [
        Check("trtllm-build", tb is not None, tb or f"{tc.trtllm_build} not on PATH", "engine builds"),
        Check(
            "quantize.py",
            qp.is_file(),
            str(qp) if qp.is_file() else f"{qp} missing (set toolchain.examples_dir)",
            "FP8/INT8/INT4 quantization steps",
        ),
    ]


def _serving_checks() -> list[Check]:
    """tritonserver, the python backend stub for this Python, tritonclient."""
    ts = find_tritonserver()
    checks = [
        Check("tritonserver", ts is not None, str(ts) if ts else "not found (pip install '.[serve]')", "trt-spec serve")
    ]
    stub = python_backend_stub()
    checks.append(
        Check(
            "python-backend stub",
            stub is not None,
            str(stub) if stub else f"no stub for Python {sys.version_info.major}.{sys.version_info.minor}",
            "python-backend models (preprocessing, BLS, reference engine)",
        )
    )
    tcv = trtllm.dist_version("tritonclient")
    tc_err = import_error("tritonclient.grpc")  # its generated protobuf code checks runtime versions at import
    checks.append(
        Check(
            "tritonclient",
            tcv is not None and tc_err is None,
            (
                f"{tcv}, but import tritonclient.grpc fails: {tc_err}"
                if tc_err and tcv
                else tcv or "not installed (make gpu-setup; pip install '.[serve]' on CPU)"
            ),
            "trt-spec repo / check / bench (tritonclient.grpc)",
        )
    )
    return checks


def _package_checks() -> list[Check]:
    checks = []
    for dist, blocks in (("torch", "engine: reference (CPU)"), ("transformers", "tokenizers in preprocessing")):
        v = trtllm.dist_version(dist)
        checks.append(Check(dist, v is not None, v or "not installed (pip install '.[reference]')", blocks))
    np_v = trtllm.dist_version("numpy")
    np_ok = np_v is not None and int(np_v.split(".")[0]) < 2
    checks.append(Check("numpy<2", np_ok, np_v or "not installed", "Triton 2.51 python backend (numpy 2 breaks it)"))
    return checks


def _disk_check(disk_path: Path) -> Check:
    usage = shutil.disk_usage(disk_path if disk_path.exists() else Path("/"))
    free_gib = usage.free / 1024**3
    return Check(
        "disk",
        free_gib >= 20,
        f"{free_gib:.0f} GiB free at {disk_path.resolve()}",
        "engine builds (a 70B FP8 build needs ~150 GiB for checkpoints + engines)",
    )
