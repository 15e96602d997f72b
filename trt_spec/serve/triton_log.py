"""The lines of a Triton log that say why the server stopped or never became ready."""

from __future__ import annotations

import json
import re

_LOG_LINE = re.compile(r"^([EWIF])\d{4} [\d:.]+\s+\d+ [^\]]*\] (.*)$")
_GPU_ABSENT = re.compile(r"CudaDriverHelper|CUDA driver|NVML|DCGM", re.I)  # logged on any machine without a GPU
# A stub that missed the python backend's health check while it loaded: Triton 2.51 aborts on it, newer ones fail the
# load (upstream-facts: triton-python-stub-start-health)
_STARVED_STUB = re.compile(r"boost::interprocess::lock_exception|Stub process '[^']+' is not healthy")


def starved_stub(text: str) -> bool:
    """The log says a python-backend stub failed the start-up health check (a starved machine, not a defect)."""
    return bool(_STARVED_STUB.search(text))


def _log_message(raw: str) -> str:
    """A record's first line, plus the innermost frame of a Python backend's `At:` block."""
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = raw[1:-1].replace("\\n", "\n")
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
    if not lines:
        return ""
    first = lines[0]
    if "At:" in lines[1:]:
        frames = lines[lines.index("At:") + 1 :]
        if frames:
            first += f" (at {frames[0]})"
    return first


def log_errors(text: str, limit: int = 8) -> list[str]:
    """The error lines of a Triton log, cause first: failed loads (else E/F records, GPU-absent noise last),
    each traceback's last line, then tritonserver's final `error: …`."""
    records: list[str] = []
    tracebacks: list[str] = []
    final: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _LOG_LINE.match(line)
        if m and m.group(1) in "EF":
            records.append(_log_message(m.group(2)))
        elif line.startswith("error: "):
            final.append(line.strip())
        elif line.startswith("Traceback (most recent call last):"):
            for nxt in lines[i + 1 :]:
                if nxt and not nxt[0].isspace():
                    tracebacks.append(nxt.strip())
                    break
    loads = [r for r in records if r.startswith("failed to load")]
    others = [r for r in records if r and r not in loads]
    quiet = [r for r in others if _GPU_ABSENT.search(r)]
    causes = loads or [r for r in others if r not in quiet] + quiet
    picked = causes + tracebacks + final
    out: list[str] = []
    for r in picked:
        r = r if len(r) <= 500 else r[:497] + "..."
        if r not in out:
            out.append(r)
    return out[:limit]


_LOADING = re.compile(r'loading: ([^:"\s]+):\d+')
_LOADED = re.compile(r"successfully loaded '([^']+)'")
_FAILED = re.compile(r"failed to load '([^']+)'")
_UNLOADED = re.compile(r"successfully unloaded '([^']+)'")


def loading_models(text: str) -> list[str]:
    """The models a Triton log shows loading and not yet loaded, failed or unloaded, in the order they started."""
    state: dict[str, bool] = {}
    for line in text.splitlines():
        if m := _LOADING.search(line):
            state[m.group(1)] = True
        elif m := _LOADED.search(line) or _FAILED.search(line) or _UNLOADED.search(line):
            state[m.group(1)] = False
    return [name for name, loading in state.items() if loading]
