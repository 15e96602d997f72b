"""`make gpu-setup`: install trt-spec and the `image` extra into the NGC image's own python3 (no venv, no torch).

Every installed package is pinned to its version, so pip cannot replace the image's TensorRT-LLM, torch or numpy;
only the distributions tritonclient bounds may move (upstream-facts: tritonclient-grpcio-protobuf-bounds).
Run from the repository root: python3 -m trt_spec.deploy.gpu_setup (standard library only).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

CONSTRAINTS_FILE = ".image-constraints.txt"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
IMAGE_EXTRA = "image"
# tritonclient 2.51..2.68's requirements (base, grpc, http) but numpy, left unpinned so pip can meet its bounds
TRITONCLIENT_BOUNDED = frozenset(
    {"grpcio", "protobuf", "greenlet", "geventhttpclient", "aiohttp", "python-rapidjson", "urllib3", "packaging"}
)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==\S+")


def canonical(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_constraints(freeze: str) -> str:
    """`pip freeze` output -> the constraints file: its NAME==VERSION lines but TRITONCLIENT_BOUNDED."""
    keep = []
    for line in freeze.splitlines():
        m = _PIN.match(line.strip())
        if m and canonical(m.group(1)) not in TRITONCLIENT_BOUNDED:
            keep.append(line.strip())
    return "\n".join(keep) + ("\n" if keep else "")


def image_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's `image` extra: what the NGC image lacks."""
    import tomllib

    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return list(extras[IMAGE_EXTRA])


def install_argv(python: str, constraints: str, project: Optional[str] = ".") -> list[str]:
    """pip install of trt-spec (editable; None leaves it out) and the image extra, under the constraints."""
    argv = [python, "-m", "pip", "install", "-c", constraints]
    if project is not None:
        argv += ["-e", project]
    return argv + image_requirements()


def main() -> int:
    py = sys.executable
    freeze = subprocess.run(
        [py, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    Path(CONSTRAINTS_FILE).write_text(image_constraints(freeze))
    free = sorted(
        f"{m.group(0)}"
        for m in (_PIN.match(x.strip()) for x in freeze.splitlines())
        if m and canonical(m.group(1)) in TRITONCLIENT_BOUNDED
    )
    print(
        f"gpu-setup: {CONSTRAINTS_FILE} pins the image's packages; left free for tritonclient: "
        f"{', '.join(free) or 'none installed'}",
        flush=True,
    )
    argv = install_argv(py, CONSTRAINTS_FILE)
    print("gpu-setup: " + " ".join(argv), flush=True)
    return subprocess.run(argv).returncode


if __name__ == "__main__":
    sys.exit(main())
