"""The OpenAI frontend as a child process of `trt-spec serve`: its command line and its lifetime."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

from ..launch import ServedRepository
from .requests import FrontendSettings


def frontend_argv(
    repo: Path,
    triton_url: str,
    port: int,
    host: str,
    api_key_file: Optional[Path] = None,
    max_concurrent: Optional[int] = None,
    max_queued: Optional[int] = None,
    max_body_bytes: Optional[int] = None,
) -> list[str]:
    """The frontend's command line; options not given are left off. The API key never goes on it (`ps` shows it)."""
    extra: list[str] = []
    for flag, value in (
        ("--api-key-file", api_key_file),
        ("--max-concurrent", max_concurrent),
        ("--max-queued", max_queued),
        ("--max-body-bytes", max_body_bytes),
    ):
        if value is not None:
            extra += [flag, str(value)]
    return [
        sys.executable,
        "-m",
        "trt_spec.serve.openai.frontend",
        "--repository",
        str(repo),
        "--triton",
        triton_url,
        "--port",
        str(port),
        "--host",
        host,
        *extra,
    ]


class FrontendProcess:
    """The frontend process (it dies with the thread that started it): start() -> wait_ready() -> stop()."""

    def __init__(self, served: ServedRepository, triton_url: str, port: int, host: str, log_path: Path, **options):
        """`options`: frontend_argv's keyword arguments."""
        from ..server import check_port_free

        FrontendSettings.from_repository(served, triton_url)  # fail in one line before anything starts
        check_port_free(host if host != "0.0.0.0" else "", port, "openai")
        self.argv = frontend_argv(served.path, triton_url, port, host, **options)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        self.log_path = Path(log_path)
        self.proc = None

    def start(self) -> "FrontendProcess":
        import signal
        import subprocess

        from ...records.procutil import die_with_parent

        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 60.0) -> "FrontendProcess":
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the OpenAI frontend exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the OpenAI frontend was not ready at {self.url} within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
