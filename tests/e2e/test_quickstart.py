"""README's "By hand" quick start, executed command by command as a user pastes it into a shell (the commands between
its quickstart markers, verbatim, in one bash session from the repository root): each must succeed, and what README
shows of its output must come out. Slow (a real SmolLM2 build on a fresh machine, then a real server): `make slow`."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- quickstart:begin -->", "<!-- quickstart:end -->"


def quickstart() -> tuple[list[str], str]:
    """(the commands, the output README shows) of the quick start."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    code, shown = re.findall(r"```(?:bash|text)\n(.*?)```", block, re.S)[:2]
    commands = [ln.split("  #")[0].rstrip() for ln in code.splitlines() if ln.strip() and not ln.startswith("#")]
    return commands, shown


def test_the_commands_are_the_pipeline():
    commands, _ = quickstart()
    verbs = [c.split()[1] if c.startswith("trt-spec") else c.split()[0] for c in commands]
    assert (
        verbs[:5] == ["build", "repo", "serve", "check", "bench"] and verbs.count("curl") >= 4 and verbs[-1] == "kill"
    )


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path):
    commands, shown = quickstart()
    if not all(_free(p) for p in (8000, 8001, 8002, 9000)):
        pytest.fail("the quick start uses the default ports 8000-8002 and 9000; something else holds one")
    script = tmp_path / "quickstart.sh"
    # each command echoed with a marker, then run; the first failure ends the script with its status
    lines = ["set -e", f"export PATH={ROOT / '.venv' / 'bin'}:$PATH", f"cd {ROOT}"]
    for i, c in enumerate(commands):
        lines += [f"echo '>>> {i}'", c]
    lines += ["wait"]  # serve, after kill %1: it drains and exits 0
    script.write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert out.count(">>> ") == len(commands), out[-4000:]
    # what README shows, line by line, came out (numbers aside: they are this machine's)
    for line in shown.splitlines():
        fixed = re.split(r"[\d.]+", line.strip())[0].strip()
        if len(fixed) >= 12:
            assert fixed in out, (fixed, out[-4000:])
    assert "verdict: PASS" in out and "drained in" in out
