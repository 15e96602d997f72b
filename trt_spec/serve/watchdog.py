"""The python-backend stubs below a running server (read from /proc), and which of them died.

Triton does not notice a dead stub (upstream-facts: triton-dead-stub-unnoticed), so `trt-spec serve` watches them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional

from .locate import STUB_NAME


class ProcStat(NamedTuple):
    state: str  # R, S, D, Z, ...
    ppid: int
    start: int  # clock ticks after boot
    cpu_s: float  # user + system


def proc_stat(pid: int) -> Optional[ProcStat]:
    """/proc/PID/stat of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # comm may hold spaces and parentheses
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return ProcStat(fields[0], int(fields[1]), int(fields[19]), cpu)


_STATES = {"R": "running", "S": "sleeping", "D": "waiting on I/O", "Z": "exited", "T": "stopped"}


def stub_state(pid: int) -> str:
    """What the kernel says a stub is doing, e.g. `stub 123 running, 41s CPU`."""
    st = proc_stat(pid)
    if st is None:
        return f"stub {pid} gone"
    return f"stub {pid} {_STATES.get(st.state, st.state)}, {st.cpu_s:.0f}s CPU"


def _nul_fields(pid: int, name: str) -> list[str]:
    """/proc/PID/NAME split at its NUL bytes ([] when the process is gone or not visible)."""
    try:
        return [a for a in Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def cmdline(pid: int) -> list[str]:
    return _nul_fields(pid, "cmdline")


def environ(pid: int) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in _nul_fields(pid, "environ") if "=" in kv)


def descendants(pid: int) -> list[int]:
    """Every process below pid, zombies included."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            st = proc_stat(int(p.name))
            if st is not None:
                children.setdefault(st[1], []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def stub_model(argv: list[str]) -> str:
    """The model a python-backend stub serves, from its argv (upstream-facts: triton-python-stub-argv)."""
    if len(argv) > 1 and argv[1].endswith(".py") and len(Path(argv[1]).parts) >= 4:
        return Path(argv[1]).parent.parent.name
    for a in reversed(argv[1:]):
        m = re.fullmatch(r"(.+)_\d+_\d+", a)
        if m:
            return m.group(1)
    return "?"


def stubs_below(pid: int) -> dict[int, str]:
    """pid -> model of every running python-backend stub below pid."""
    out = {}
    for child in descendants(pid):
        argv = cmdline(child)  # empty for a zombie
        if argv and argv[0].endswith(STUB_NAME):
            out[child] = stub_model(argv)
    return out


@dataclass(frozen=True)
class DeadModel:
    model: str
    pid: int


def dead_models_message(dead: list[DeadModel], restart: str) -> str:
    """One line for `trt-spec serve` to print when a model's python-backend process died."""
    names = ", ".join(sorted({d.model for d in dead}))
    pids = ", ".join(str(d.pid) for d in dead)
    what = (
        f"model {names} stopped (its python-backend process {pids} died)"
        if len(dead) == 1
        else f"models {names} stopped (their python-backend processes {pids} died)"
    )
    return f"error: {what}; stopping the server — restart it with: {restart}"


class StubWatch:
    """The stubs of one server, seen and watched. Every method takes the stubs running now (stubs_below)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[str, int]] = {}
        self._watched: Optional[dict[int, tuple[str, int]]] = None

    @staticmethod
    def _alive(pid: int, started: int) -> bool:
        st = proc_stat(pid)
        return st is not None and st[0] not in "ZX" and st[2] == started

    def scan(self, running: dict[int, str]) -> None:
        """Remember each stub seen; call it while loading too (a stub that dies early is a zombie without argv)."""
        for pid, model in running.items():
            st = proc_stat(pid)
            if st is not None and model != "?":
                self._seen[pid] = (model, st[2])

    def watch(self, running: dict[int, str]) -> None:
        """Watch the stubs seen so far: the live ones, and dead ones whose model has no live stub now."""
        self.scan(running)
        live = {pid for pid, (_, started) in self._seen.items() if self._alive(pid, started)}
        served = {self._seen[pid][0] for pid in live}
        self._watched = {pid: v for pid, v in self._seen.items() if pid in live or v[0] not in served}

    def dead(self, running: dict[int, str]) -> list[DeadModel]:
        """Watched stubs that exited or are zombies (rescans first: a reloaded model has a new stub)."""
        self.watch(running)
        return [
            DeadModel(model, pid)
            for pid, (model, started) in (self._watched or {}).items()
            if not self._alive(pid, started)
        ]
