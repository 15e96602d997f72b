"""Finding tritonserver and the python-backend stub (NGC image first, else nvidia-pytriton's bundled binary), and
preparing the backend directory and environment nvidia-pytriton's binary needs (see ../shared/TRITON_ON_CPU.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Optional

from ..records import defaults
from .errors import ServerError

STUB_NAME = "triton_python_backend_stub"
NGC_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
NGC_PYTHON_STUB = Path("/opt/tritonserver/backends/python") / STUB_NAME
PYTHON_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # picks nvidia-pytriton's stub


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


def is_pytriton(binary: Path) -> bool:
    """Whether `binary` is nvidia-pytriton's tritonserver."""
    d = pytriton_dir()
    return binary != NGC_TRITONSERVER and d is not None and str(binary).startswith(str(d))


def _pytriton_stub(d: Path) -> Path:
    return d / "python_backend_stubs" / PYTHON_VERSION / STUB_NAME


def python_backend_stub() -> Optional[Path]:
    """The NGC image's stub first, then nvidia-pytriton's for this interpreter."""
    if NGC_PYTHON_STUB.is_file():
        return NGC_PYTHON_STUB
    d = pytriton_dir()
    if d is not None and _pytriton_stub(d).is_file():
        return _pytriton_stub(d)
    return None


def pytriton_layout(workdir: Path) -> tuple[Path, Path, dict[str, str]]:
    """(stub to copy, backend dir in workdir, env) for the binary bundled in nvidia-pytriton; copies nothing."""
    d = pytriton_dir()
    if d is None:
        raise ServerError(
            "no tritonserver: not in the NGC image and nvidia-pytriton is not installed; "
            "pip install 'trt-spec[serve]' (or run `make setup`)"
        )
    stub = _pytriton_stub(d)
    if not stub.is_file():
        raise ServerError(
            f"nvidia-pytriton has no python-backend stub for Python {PYTHON_VERSION}; use Python 3.8-3.13"
        )
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    libs = d.parent.parent / "nvidia_pytriton.libs"
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (libdir, str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return stub, workdir / "backends", env


def prepare_pytriton_backends(workdir: Path) -> tuple[Path, dict[str, str]]:
    """Copy pytriton's backends + this interpreter's stub into workdir; return (backend dir, env)."""
    stub, backends, env = pytriton_layout(workdir)
    if not backends.exists():
        shutil.copytree(pytriton_dir() / "backends", backends)
        shutil.copy2(stub, backends / "python" / STUB_NAME)
    return backends, env


def plain_backends_dir() -> Path:
    """The cached backend directory the plain command names, one per nvidia-pytriton and Python version (a work dir
    dies with its server)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("nvidia-pytriton")
    except PackageNotFoundError:
        v = "unknown"
    return defaults.cache_dir() / defaults.PLAIN_BACKENDS_SUBDIR / f"pytriton-{v}-py{PYTHON_VERSION}" / "backends"


def prepare_cached_backends(backends: Path) -> Path:
    """Make `backends` once, via a rename into place so that two launchers at once both succeed."""
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
