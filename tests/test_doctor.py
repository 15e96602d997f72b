"""`trt-spec doctor` imports what the served python models import, and tritonclient.grpc, in the interpreter it runs in
(on a GPU host: the image's python3, which tritonserver's python backend runs), one line per module that fails
(issue 30 item 4)."""

import ast
import sys

from click.testing import CliRunner

from trt_spec import doctor
from trt_spec.cli import main

from .conftest import REPO


def test_the_imports_come_from_the_models_source():
    imports = doctor.served_imports(REPO / "model_repo")
    assert {"numpy", "yaml", "torch", "trt_spec.served.serving", "trt_spec.served.speculative_loop"} <= set(imports)
    assert "triton_python_backend_utils" not in imports  # the stub's own, inside tritonserver only
    assert not any(m.split(".")[0] in sys.stdlib_module_names for m in imports)  # json, asyncio, ...
    assert imports["torch"] == {"reference_engine": set()}
    assert "backend_contract" in imports["trt_spec.records"]["reference_engine"]  # from package import module
    assert set(imports["numpy"]) == {"llmapi", "postprocessing", "preprocessing", "tensorrt_llm_bls"}
    # every import statement of every model is covered (an independent walk)
    for f in (REPO / "model_repo").glob("*/1/model.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] not in sys.stdlib_module_names | {
                    "triton_python_backend_utils"}:
                assert f.parent.parent.name in imports[node.module]


def test_one_line_per_module_the_models_cannot_import(tmp_path):
    m = tmp_path / "mymodel" / "1"
    m.mkdir(parents=True)
    (m / "model.py").write_text(
        "import json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"
        "from trt_spec.records import no_such_submodule\n\n"
        "def initialize():\n    import not_a_module_trt_spec_test\n")
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
    assert "import tritonclient.grpc fails: ModuleNotFoundError" in tc and "(blocks: trt-spec repo / check / bench" in tc
    (y,) = [line for line in out if line.startswith("-- import yaml ")]
    assert "(blocks: the python model(s) llmapi)" in y
