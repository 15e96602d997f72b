"""The package tree is the architecture: stages are folders of trt_spec/, and data flows one way. No module imports
(at module level or lazily inside a function) from a later stage, and the top-level model_repo/ ships the python
models."""

import ast
from pathlib import Path

from .conftest import REPO

PKG = REPO / "trt_spec"
# Earlier stages never import later ones. records: what every stage reads; reference: the CPU engine (a library the
# build exports with and the stand-in serves); then build -> what runs inside tritonserver -> repository and launcher
# -> the client harness -> deploy -> the CLI shell on top.
ORDER = ["records", "reference", "builder", "in_triton", "repository", "serve", "harness", "deploy", "cli"]
TOP = {"cli", "demo", "doctor", "gpu_smoke"}  # the CLI and the commands it composes


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "errors":  # trt_spec itself (__version__), the one error base
        return "records"
    return "cli" if parts[1] in TOP else parts[1]


def imports(path: Path, module: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = (
                    module.split(".")[: -node.level]
                    if path.name != "__init__.py"
                    else module.split(".")[: len(module.split(".")) - node.level + 1]
                )
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
                out.update(names)
            elif node.module and node.module.startswith("trt_spec"):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("trt_spec"))
    return out


def modules():
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield p, ".".join(parts)


def test_stages_are_folders():
    flat = sorted(p.name for p in PKG.glob("*.py"))
    assert flat == ["__init__.py", "cli.py", "demo.py", "doctor.py", "errors.py", "gpu_smoke.py"]
    assert {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__" and not p.is_symlink()} == set(
        ORDER
    ) - {"cli"}


def test_no_module_imports_a_later_stage():
    upward = []
    for path, module in modules():
        here = ORDER.index(stage_of(module))
        for target in imports(path, module):
            if not target.startswith("trt_spec"):
                continue
            there = stage_of(target)
            if there in ORDER and ORDER.index(there) > here:
                upward.append(f"{module} imports {target}")
    assert upward == []


def test_later_stages_read_the_deployment_not_the_builder():
    """The builder resolves the Deployment once; the repository and serve stages project it and never reach back
    into the builder's modules (its preflight, its model facts, its memory plan)."""
    reach = [
        f"{module} imports {target}"
        for path, module in modules()
        if stage_of(module) in ("repository", "serve")
        for target in imports(path, module)
        if target.startswith("trt_spec.builder")
    ]
    assert reach == []


def test_model_repo_holds_the_python_models_nvidia_style():
    models = sorted(p.parent.parent.name for p in (REPO / "model_repo").glob("*/1/model.py"))
    assert models == ["llmapi", "postprocessing", "preprocessing", "reference_engine", "tensorrt_llm_bls"]


def test_no_import_cycle():
    """No two modules reach each other through imports, lazy ones inside functions included (an import inside a
    function hides a cycle from Python at import time, not from this test). A package's __init__ counts as the
    package."""
    mods = dict((m, p) for p, m in modules())
    graph = {}
    for module, path in ((m, p) for m, p in mods.items()):
        edges = set()
        for target in imports(path, module):
            while target and target not in mods:  # `from pkg.mod import name` names a module or an attribute
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


def test_no_function_is_longer_than_80_lines():
    """Every function (method, nested function) of trt_spec/ fits on a screen: at most 80 lines, decorators
    included. Split a longer one into helpers; keep a command line's flag and its value on one line (# fmt: off)."""
    limit = 80
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                n = node.end_lineno - start + 1
                if n > limit:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert long == [], f"functions over {limit} lines:\n" + "\n".join(long)
