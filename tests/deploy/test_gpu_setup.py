"""`make gpu-setup` resolves in the image (issue 30 item 4): pip's real resolver, offline, on tiny local wheels that
stand in for tritonclient and what it requires, with tritonclient's real bounds (triton-inference-server/client
src/python/library/requirements/*.txt at r24.10 = 2.51.0, r24.11 = 2.52.0, r26.03 = 2.67.0, r26.04 = 2.68.0), against
an image whose grpcio and protobuf are newer than any tritonclient >= 2.52 accepts."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trt_spec.deploy import gpu_setup

from ..conftest import REPO

_GRPC_52 = [
    "grpcio>=1.63.0,<1.68",
    "numpy>=1.19.1,<2",
    "packaging>=14.1",
    "protobuf>=5.26.1,<6.0dev",
    "python-rapidjson>=0.9.1",
]
_HTTP_52 = ["aiohttp>=3.8.1,<4.0.0", "geventhttpclient>=2.3.3", "numpy>=1.19.1,<2", "python-rapidjson>=0.9.1"]
TRITONCLIENT = {  # version -> (requirements.txt, requirements_grpc.txt, requirements_http.txt)
    "2.51.0": (
        ["numpy>=1.19.1,<2", "python-rapidjson>=0.9.1", "urllib3>=2.0.7"],
        ["grpcio>=1.41.0", "numpy>=1.19.1,<2", "packaging>=14.1", "protobuf>=3.5.0,<5", "python-rapidjson>=0.9.1"],
        ["aiohttp>=3.8.1,<4.0.0", "geventhttpclient>=1.4.4,<=2.0.2", "numpy>=1.19.1,<2", "python-rapidjson>=0.9.1"],
    ),
    "2.52.0": (["numpy>=1.19.1,<2", "python-rapidjson>=0.9.1", "urllib3>=2.0.7"], _GRPC_52, _HTTP_52),
    "2.67.0": (
        ["numpy>=1.19.1", "python-rapidjson>=0.9.1", "urllib3>=2.0.7"],
        [
            "grpcio>=1.63.0,<1.68",
            "numpy>=1.19.1",
            "packaging>=14.1",
            "protobuf>=6.30.0,<7.0",
            "python-rapidjson>=0.9.1",
        ],
        ["aiohttp>=3.8.1,<4.0.0", "geventhttpclient>=2.3.3", "numpy>=1.19.1", "python-rapidjson>=0.9.1"],
    ),
    "2.68.0": (
        ["numpy>=1.19.1", "python-rapidjson>=0.9.1", "urllib3>=2.0.7"],
        [
            "grpcio>=1.63.0,<1.68",
            "numpy>=1.19.1",
            "packaging>=14.1",
            "protobuf>=6.30.0,<7.0",
            "python-rapidjson>=0.9.1",
        ],
        [
            "aiohttp>=3.8.1,<4.0.0",
            "geventhttpclient>=2.3.3",
            "greenlet<3.4.0",
            "numpy>=1.19.1",
            "python-rapidjson>=0.9.1",
        ],
    ),
}
# 2.69+ (here 2.73.0, the wheel's own METADATA as pip installs it from PyPI) need grpcio >= 1.81.1
TRITONCLIENT["2.73.0"] = (
    ["ml-dtypes<=0.5.4", "numpy>=1.19.1", "python-rapidjson>=0.9.1", "urllib3>=2.0.7"],
    ["grpcio>=1.81.1", "numpy>=1.19.1", "packaging>=14.1", "protobuf<7.0,>=6.30.0", "python-rapidjson>=0.9.1"],
    [
        "aiohttp<4.0.0,>=3.8.1",
        "geventhttpclient>=2.3.3",
        "greenlet<3.4.0",
        "numpy>=1.19.1",
        "python-rapidjson>=0.9.1",
    ],
)
LEAVES = {
    "grpcio": ["1.41.0", "1.67.1", "1.70.0", "1.81.1"],
    "ml-dtypes": ["0.5.4"],
    "protobuf": ["4.25.3", "5.29.3", "6.31.1", "7.34.0"],
    "greenlet": ["3.3.2", "3.4.1"],
    "geventhttpclient": ["2.0.2", "2.3.3"],
    "aiohttp": ["3.9.5"],
    "numpy": ["1.26.4"],
    "python-rapidjson": ["1.20"],
    "urllib3": ["2.2.1"],
    "packaging": ["24.0"],
    "fastapi": ["0.115.0"],
    "uvicorn": ["0.30.0"],
    "prometheus-client": ["0.20.0"],
    "openai": ["1.40.0"],
}
# The image: TensorRT-LLM 1.2.1 and torch pinned, grpcio and protobuf newer than tritonclient >= 2.52 allows.
IMAGE_FREEZE = """\
tensorrt-llm==1.2.1
torch==2.10.0a0+b4e4ee81d3.nv25.12
numpy==1.26.4
grpcio==1.70.0
protobuf==7.34.0
greenlet==3.4.1
packaging==24.0
urllib3==2.2.1
fastapi==0.115.0
-e git+https://example.invalid/x.git@0#egg=local_thing
"""
# The recipe before the fix (the Makefile's gpu-setup): every NAME==VERSION line of pip freeze pinned.
OLD_PIN = re.compile(r"^[A-Za-z0-9_.-]+==")


def wheel(d: Path, name: str, version: str, requires=(), extras=None) -> None:
    dist = re.sub(r"[-_.]+", "_", name)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in (extras or {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(d / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/__init__.py", "")
        z.writestr(f"{info}/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    for v, (base, grpc, http) in TRITONCLIENT.items():
        wheel(d, "tritonclient", v, base, {"grpc": grpc, "http": http})
    for name, versions in LEAVES.items():
        for v in versions:
            wheel(d, name, v)
    return d


def resolve(index: Path, constraints: str, tmp_path: Path) -> tuple[int, dict, str]:
    """pip's resolver, offline (no index, no pip config, nothing installed counted), on the recipe's requirements."""
    c = tmp_path / "constraints.txt"
    c.write_text(constraints)
    report = tmp_path / "report.json"
    argv = gpu_setup.install_argv(sys.executable, str(c), project=None)
    argv += [
        "--dry-run",
        "--ignore-installed",
        "--no-index",
        "--find-links",
        str(index),
        "--report",
        str(report),
        "--quiet",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    chosen = {}
    if r.returncode == 0:
        chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    return r.returncode, chosen, r.stdout + r.stderr


def test_the_old_recipe_cannot_resolve_tritonclient_in_such_an_image(index, tmp_path):
    old = "".join(line + "\n" for line in IMAGE_FREEZE.splitlines() if OLD_PIN.match(line))
    rc, _, out = resolve(index, old, tmp_path)
    assert rc != 0 and "ResolutionImpossible" in out, out


def test_the_recipe_resolves_and_still_pins_the_image(index, tmp_path):
    constraints = gpu_setup.image_constraints(IMAGE_FREEZE)
    pinned = {gpu_setup.canonical(line.split("==")[0]) for line in constraints.splitlines()}
    assert {"tensorrt-llm", "torch", "numpy", "fastapi"} <= pinned  # never replaced
    assert not pinned & gpu_setup.TRITONCLIENT_BOUNDED and "local-thing" not in pinned
    rc, chosen, out = resolve(index, constraints, tmp_path)
    assert rc == 0, out
    assert chosen["tritonclient"] == "2.68.0"
    assert (chosen["grpcio"], chosen["protobuf"], chosen["greenlet"]) == ("1.67.1", "6.31.1", "3.3.2")
    assert chosen["numpy"] == "1.26.4" and chosen["fastapi"] == "0.115.0"


def test_users_run_this_recipe_and_pyproject_has_one_tritonclient():
    """`make gpu-setup` runs trt_spec/deploy/gpu_setup.py (then doctor); the image extra it installs names tritonclient
    as the serve extra does."""
    import tomllib

    target = re.search(r"^gpu-setup:\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert [ln.strip() for ln in target.splitlines()] == [
        "$(PY) -m trt_spec.deploy.gpu_setup",
        "$(PY) -m trt_spec.cli doctor",
    ]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    tc = lambda reqs: [r for r in reqs if r.startswith("tritonclient")]  # noqa: E731
    assert tc(extras["serve"]) == ["tritonclient[http,grpc]>=2.51"]
    assert tc(extras["image"]) == ["tritonclient[http,grpc]==2.68.*"]  # the image's own Triton
    assert gpu_setup.image_requirements() == extras["image"]
    argv = gpu_setup.install_argv("python3", ".image-constraints.txt")
    assert argv[:8] == ["python3", "-m", "pip", "install", "-c", ".image-constraints.txt", "-e", "."]


def test_without_the_pin_the_resolver_takes_a_tritonclient_newer_than_the_image(index, tmp_path, monkeypatch):
    """Why the image extra pins 2.68.*: unpinned, pip takes the newest tritonclient and moves the image's grpcio past
    what its TensorRT-LLM shipped with."""
    pinned = gpu_setup.image_requirements()
    monkeypatch.setattr(gpu_setup, "image_requirements", lambda: [r.replace("==2.68.*", ">=2.51") for r in pinned])
    rc, chosen, out = resolve(index, gpu_setup.image_constraints(IMAGE_FREEZE), tmp_path)
    assert rc == 0, out
    assert (chosen["tritonclient"], chosen["grpcio"]) == ("2.73.0", "1.81.1")
