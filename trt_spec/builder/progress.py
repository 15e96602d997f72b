"""A running build step's progress (elapsed time and the last log line), handed to the CLI's display from a thread."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Optional, Protocol


class Display(Protocol):
    period: float  # seconds between updates

    def start(self) -> None: ...

    def update(self, text: str) -> None: ...

    def stop(self) -> None: ...


def last_line(log: Path, width: int = 100) -> str:
    """The last non-empty line of log (a carriage return ends a line too), cut to width; "" if unreadable."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").replace("\r", "\n").splitlines()]
    except OSError:
        return ""
    last = next((ln for ln in reversed(lines) if ln), "")
    return last if len(last) <= width else last[: width - 1] + "…"


class StepWatch:
    """One running step at a time: start() when its tool starts, stop() (its seconds) when it ends."""

    def __init__(self) -> None:
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        self.t0 = 0.0

    def start(self, label: str, log: Path, display: Display) -> None:
        self.t0, self._stop = time.monotonic(), threading.Event()
        stop = self._stop

        def tick() -> None:
            # Signals must reach the main thread (blocked in waitpid); the display's threads inherit this mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
            display.start()
            while not stop.wait(display.period):
                last = last_line(log)
                display.update(f"{label}: {time.monotonic() - self.t0:.0f}s" + (f" — {last}" if last else ""))
            display.stop()

        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=2)
        return time.monotonic() - self.t0
