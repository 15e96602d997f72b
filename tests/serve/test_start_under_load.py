"""A start on a busy machine: a python-backend stub that gets no CPU for a few seconds while its model loads fails the
backend's health check, and Triton 2.51 aborts (exit -6, boost::interprocess::lock_exception); serve starts it again
(serve/server.py). The starvation is made deterministic with SIGSTOP on a real stub of a real tritonserver. Slow: it
owns its server's life (two starts), as the launcher tests do."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from trt_spec.serve.server import TritonServer, free_port

pytestmark = pytest.mark.slow

PAUSE_S = 4.0  # 1.2 s passed, 2.5 s and 4 s aborted Triton 2.51 (docs/reliability.md)


def _pause_first_stub(server: TritonServer, model: str, done: threading.Event) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not done.is_set():
        stubs = {m: pid for pid, m in server.stubs().items()}
        if model in stubs:
            time.sleep(1.0)  # inside its initialize()
            try:
                os.kill(stubs[model], signal.SIGSTOP)
                time.sleep(PAUSE_S)
                os.kill(stubs[model], signal.SIGCONT)
            except ProcessLookupError:
                pass  # the server's cleanup killed it
            return
        time.sleep(0.05)


def test_a_stub_starved_while_loading_costs_a_restart_not_the_start(farm, tmp_path):
    repo = farm.repo("ngram")
    server = TritonServer(
        repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=tmp_path / "t.log"
    )
    notes: list[str] = []
    server.note = notes.append
    done = threading.Event()
    pauser = threading.Thread(target=_pause_first_stub, args=(server, "tensorrt_llm", done), daemon=True)
    server.start()
    pauser.start()
    try:
        server.wait_ready(600)
        assert server.is_ready()
    finally:
        done.set()
        server.stop()
        pauser.join(10)
    failed = tmp_path / "t.log.failed-start"
    assert len(notes) == 1 and notes[0].startswith("note: tritonserver exited with code -6 while loading")
    assert str(failed) in notes[0]
    assert "boost::interprocess::lock_exception" in failed.read_text()
