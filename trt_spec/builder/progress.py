"""A build step's progress while its tool runs: the elapsed time and the last line the tool wrote to its log
(distillation epochs, EAGLE training steps, calibration batches), handed to a display every `period` seconds from a
thread of its own. The display (a live status line on a terminal, a plain line elsewhere) is the CLI's."""

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
            # Ctrl-C/SIGTERM/SIGHUP must land on the main thread: delivered to this one (or to a display's refresh
            # thread, started here so that it inherits the mask), they would leave the main thread blocked in waitpid
            # until the tool ended by itself (Python runs signal handlers on the main thread only)
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
