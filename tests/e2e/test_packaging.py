"""trt-spec installed from a wheel, as a GPU host installs it (`pip install '.[gpu]'`, not editable), writes and
serves a model repository: the python-backend models ship inside the package and the Triton stubs import trt_spec
from the wheel, not from this checkout.

The wheel goes into a fresh venv outside the checkout (--no-deps); the heavy dependencies come from the checkout's
venv through a .pth path line (a path line does not process the .pth files in that directory, so the checkout's
editable-install finder stays off). A test-only audit hook in the new venv records every trt_spec file any of its
processes opens (the stubs included), so the test sees where each process imported trt_spec from.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from trt_spec.harness.client import ClientError, LLMClient
from trt_spec.serve.server import free_port

ROOT = Path(__file__).resolve().parents[2]
STUB = "triton_python_backend_stub"
PROMPT = "def add(a, b):\n    return"
GREEDY = {"exclude_input_in_output": True}
IMPORT_LOG_VAR = "PACKAGING_TEST_IMPORT_LOG"

# Imported by the new venv's .pth at every interpreter start (tritonserver's python-backend stubs included): one
# line "pid<TAB>executable<TAB>path" per trt_spec file the process opens (sources and bytecode).
IMPORT_AUDIT = f'''"""Test-only (tests/e2e/test_packaging.py): record where this process reads trt_spec from."""
import os
import sys

_LOG = os.environ.get("{IMPORT_LOG_VAR}")
if _LOG:
    _EXE = os.readlink("/proc/self/exe")
    _MARK = os.sep + "trt_spec" + os.sep

    def _hook(event, args):
        if event == "open" and isinstance(args[0], str) and _MARK in args[0] and args[0].endswith((".py", ".pyc")):
            fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, f"{{os.getpid()}}\\t{{_EXE}}\\t{{os.path.abspath(args[0])}}\\n".encode())
            finally:
                os.close(fd)

    sys.addaudithook(_hook)
'''


def _ignore(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == ROOT
    return {
        n
        for n in names
        if n in ("__pycache__", ".pytest_cache")
        or n.endswith(".egg-info")
        or (top and n in (".venv", ".git", "build", "dist"))
    }


def build_wheel(dest: Path) -> Path:
    """A wheel of this checkout, offline. Built from a copy of the tree: setuptools writes build/ and *.egg-info into
    the tree it builds, and reuses a stale build/lib (a module deleted since an earlier build would still ship)."""
    src = dest / "src"
    shutil.copytree(ROOT, src, ignore=_ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dest / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=dest,
    )
    (wheel,) = (dest / "dist").glob("trt_spec-*.whl")
    return wheel


def make_venv(venv: Path, wheel: Path) -> Path:
    """venv with the wheel installed and the checkout venv's site-packages on sys.path; returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # this (the checkout's) venv
    (site / "_import_audit.py").write_text(IMPORT_AUDIT)
    (site / "zz_checkout_deps.pth").write_text("import _import_audit\n" + "".join(f"{d}\n" for d in deps))
    return site


def _run(argv: list[str], env: dict, cwd: Path) -> str:
    r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{argv} exited with {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _imports(log: Path) -> dict[int, tuple[str, set[Path]]]:
    """pid -> (executable, trt_spec files it read)."""
    out: dict[int, tuple[str, set[Path]]] = {}
    for line in log.read_text().splitlines():
        pid, exe, path = line.split("\t")
        out.setdefault(int(pid), (exe, set()))[1].add(Path(path))
    return out


def _module(site: Path, f: Path) -> str:
    """The module of a source or bytecode file under site (trt_spec/x/__pycache__/y.cpython-311.pyc: trt_spec.x.y)."""
    rel = f.relative_to(site)
    parts = (
        (rel.parent.parent.parts + (rel.name.split(".")[0],))
        if rel.parent.name == "__pycache__"
        else rel.with_suffix("").parts
    )
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trt_spec_modules(model_py: Path) -> set[str]:
    tree = ast.parse(model_py.read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {m for m in mods if m == "trt_spec" or m.startswith("trt_spec.")}


@pytest.mark.slow
def test_wheel_install_writes_and_serves_a_repository(ngram_server, tmp_path):
    work = tmp_path.resolve()
    assert not work.is_relative_to(ROOT)
    build_dir = ngram_server.repo.parent / "build"  # what the farm built (tests/farm.py)
    assert (build_dir / "manifest.json").is_file()

    site = make_venv(work / "venv", build_wheel(work / "wheel"))
    bin_dir = work / "venv" / "bin"
    log = work / "imports.tsv"
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV")
    }
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1")
    env[IMPORT_LOG_VAR] = str(log)

    # `import trt_spec` in the new venv is the wheel's copy; the checkout is nowhere on its path
    probe = json.loads(
        _run(
            [
                str(bin_dir / "python"),
                "-c",
                "import json, sys, trt_spec; print(json.dumps({'file': trt_spec.__file__, "
                "'path': sys.path, 'editable': [m for m in sys.modules if m.startswith('__editable__')]}))",
            ],
            env,
            work,
        )
    )
    assert Path(probe["file"]) == site / "trt_spec" / "__init__.py"
    assert probe["editable"] == []
    others = [p for p in probe["path"] if p and Path(p) != site and (Path(p) / "trt_spec").exists()]
    assert others == [], f"another trt_spec on the new venv's sys.path: {others}"
    shipped = site / "trt_spec" / "model_repo"  # the checkout's top-level model_repo/, mapped by pyproject.toml
    assert sorted(p.parent.parent.name for p in shipped.glob("*/1/model.py")) == [
        "llmapi",
        "postprocessing",
        "preprocessing",
        "reference_engine",
        "tensorrt_llm_bls",
    ]

    # the wheel's `trt-spec repo`, run outside the checkout, copies the wheel's model sources
    repo = work / "repo"
    _run([str(bin_dir / "trt-spec"), "repo", str(build_dir), "--out", str(repo)], env, work)
    served = sorted(repo.glob("*/1/model.py"))
    assert {p.parts[-3] for p in served} == {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}
    for p in served:
        src = shipped / ("reference_engine" if p.parts[-3] == "tensorrt_llm" else p.parts[-3]) / "1" / "model.py"
        assert p.read_bytes() == src.read_bytes(), p

    # served by the wheel's `trt-spec serve` with the new venv's interpreter (its bin leads the stubs' PATH)
    http, grpc, metrics = free_port(), free_port(), free_port()
    with open(work / "serve.out", "w") as out, open(work / "serve.err", "w") as err:
        proc = subprocess.Popen(
            [
                str(bin_dir / "trt-spec"),
                "serve",
                str(repo),
                "--http-port",
                str(http),
                "--grpc-port",
                str(grpc),
                "--metrics-port",
                str(metrics),
                "--log",
                str(work / "server.log"),
            ],
            stdout=out,
            stderr=err,
            env=env,
            cwd=work,
        )

    def server_said() -> str:
        tail = (work / "server.log").read_text()[-4000:] if (work / "server.log").exists() else ""
        return f"serve stderr:\n{(work / 'serve.err').read_text()}\nserver log tail:\n{tail}"

    client, checkout = LLMClient(f"127.0.0.1:{grpc}", "grpc"), LLMClient(ngram_server.grpc_url, "grpc")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"serve exited with {proc.returncode}\n{server_said()}"
            try:
                client.check_ready(["ensemble", "tensorrt_llm_bls"])
                break
            except ClientError:
                assert time.monotonic() < deadline, f"not ready after 120 s\n{server_said()}"
                time.sleep(0.5)

        # greedy: the wheel's server answers exactly as the checkout's server on the same engines
        for model in ("tensorrt_llm_bls", "ensemble"):
            got, want = client.generate(model, PROMPT, 16, **GREEDY), checkout.generate(model, PROMPT, 16, **GREEDY)
            assert got.output_ids and got.output_ids == want.output_ids, model
            assert got.text == want.text, model

        # every stub read trt_spec from the wheel install, each model's trt_spec imports among them, and no
        # process of the new venv read anything of the checkout
        imports = _imports(log)
        stubs = {pid: files for pid, (exe, files) in imports.items() if Path(exe).name == STUB}
        assert len(stubs) >= len(served), f"{len(served)} python models, trt_spec seen in {len(stubs)} stubs"
        read = set().union(*(files for _, files in imports.values()))
        outside = sorted(str(f) for f in read if not f.is_relative_to(site))
        assert outside == [], f"read trt_spec outside the wheel install: {outside[:5]}"
        stub_modules = {_module(site, f) for files in stubs.values() for f in files}
        for p in served:
            missing = _trt_spec_modules(p) - stub_modules
            assert not missing, f"{p.parts[-3]} imports {sorted(missing)}, which no stub read from the wheel install"
    finally:
        client.close()
        checkout.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # serve stops its server (and the stubs) on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()  # the server dies with its launcher
                proc.wait()
    assert proc.returncode == 0, f"serve exited with {proc.returncode} on SIGTERM\n{server_said()}"
