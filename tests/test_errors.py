"""Every error trt-spec raises on purpose derives from TrtSpecError, and the CLI prints any of them as one line."""

import ast
from pathlib import Path

from click.testing import CliRunner

import trt_spec
from trt_spec.cli import main
from trt_spec.errors import TrtSpecError

PACKAGE = Path(trt_spec.__file__).parent


def _exception_classes() -> dict[str, list[str]]:
    """class name -> its base names, for every class in trt_spec whose bases name an exception."""
    found = {}
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                if any(b.endswith(("Error", "Exception")) or b in ("Cancelled", "ShuttingDown") for b in bases):
                    found[f"{f.relative_to(PACKAGE)}:{node.name}"] = bases
    return found


def test_every_project_error_derives_from_the_one_base():
    classes = _exception_classes()
    names = {k.split(":")[1] for k in classes}
    assert len(classes) > 25
    for where, bases in classes.items():
        if where.endswith((":UserError", ":TrtSpecError")):  # the base, and the CLI's one-line form of it
            continue
        assert "TrtSpecError" in bases or any(b in names for b in bases), f"{where} derives from {bases}"


def test_the_cli_prints_a_project_error_as_one_line(monkeypatch):
    from trt_spec.harness import commands

    def fails(*a, **k):
        raise type("OddError", (TrtSpecError,), {})("the thing is wrong; do the fix")

    monkeypatch.setattr(commands, "served_client", fails)
    r = CliRunner().invoke(main, ["check", "--url", "127.0.0.1:1"])
    assert r.exit_code == 2
    assert r.output.strip() == "error: the thing is wrong; do the fix"
