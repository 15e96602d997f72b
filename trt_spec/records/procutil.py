"""Child processes that die with their parent (the build's step tools, tritonserver), whatever kills it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Callable, Optional


def shell_line(argv, env: Optional[dict] = None) -> str:
    """A command as one pasteable bash line: VAR=value ... argv, every word quoted as the shell needs."""
    import shlex

    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(sig: int) -> Optional[Callable[[], None]]:
    """A preexec_fn: the child gets `sig` when the spawning *thread* exits, even by kill -9 (Linux; else None).

    A parent that died before prctl took effect sends nothing, so the child then signals itself."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not between fork and exec
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:  # between fork and exec: keep it minimal
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), int(sig))

    return preexec


def stop_group(proc: "subprocess.Popen", grace_s: float) -> None:
    """SIGTERM to proc's process group (it was started with start_new_session), SIGKILL after grace_s; reaped."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
