"""`make gpu-setup`: install trt-spec into the NGC image's own python3 (no venv, no torch), as one recipe the tests run.

Every package the image already has is pinned to its installed version (a constraints file from `pip freeze`), so pip
fails rather than replace the image's TensorRT-LLM, torch or numpy; then `trt-spec doctor` (Makefile) imports what the
served python models and the clients need. Pinned, except the distributions tritonclient's own requirements bound
(triton-inference-server/client src/python/library/requirements/requirements{,_grpc,_http}.txt): 2.51 (r24.10) needs
protobuf<5; every release from 2.52 (r24.11) to 2.68 (r26.04) needs grpcio>=1.63,<1.68 and protobuf>=5.26.1,<6
(2.68: protobuf>=6.30,<7); 2.68's http extra adds greenlet<3.4. An image whose grpcio or protobuf is newer would make
the install unresolvable (and `trt-spec repo`/`check`/`bench` lose tritonclient), so pip may move those within
tritonclient's range. numpy stays pinned: trt-spec itself needs numpy<2, as the image's TensorRT-LLM does.

What is installed besides trt-spec (`pip install -e .`) is pyproject.toml's `image` extra: one list, read from there.

Run from the repository root: python3 -m trt_spec.deploy.gpu_setup (standard library only: nothing is installed yet).
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
# Every distribution tritonclient 2.51..2.68 requires (base, grpc and http extras), but numpy: never pinned to the
# image's version, so pip can satisfy tritonclient's bounds on them.
TRITONCLIENT_BOUNDED = frozenset(
    {"grpcio", "protobuf", "greenlet", "geventhttpclient", "aiohttp", "python-rapidjson", "urllib3", "packaging"}
)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==\S+")


def canonical(name: str) -> str:
    """PEP 503 name normalization (pip freeze prints names as their metadata spells them)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_constraints(freeze: str) -> str:
    """`pip freeze --exclude-editable` output -> the constraints file: every NAME==VERSION line, except the
    distributions tritonclient bounds (TRITONCLIENT_BOUNDED). Lines that are not pins (URLs, comments) are dropped."""
    keep = []
    for line in freeze.splitlines():
        m = _PIN.match(line.strip())
        if m and canonical(m.group(1)) not in TRITONCLIENT_BOUNDED:
            keep.append(line.strip())
    return "\n".join(keep) + ("\n" if keep else "")


def image_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's `image` extra: what the NGC image lacks (tritonclient, the OpenAI frontend's packages)."""
    import tomllib

    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return list(extras[IMAGE_EXTRA])


def install_argv(python: str, constraints: str, project: Optional[str] = ".") -> list[str]:
    """The install: trt-spec (editable; `project` None leaves it out) and the image extra, under the constraints."""
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
