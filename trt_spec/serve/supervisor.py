"""`trt-spec serve` as one function, run(options) -> exit code: tritonserver (and the OpenAI frontend) until a
signal, then drain and stop. A second signal, or one before serving, stops at once.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..records import defaults
from .errors import ServerError
from .launch import ServedRepository, launch_spec
from .server import TritonServer
from .watchdog import dead_models_message

MODEL_DIED_EXIT = 3  # a model's python-backend process died

Say = Callable[[str], None]


@dataclass(frozen=True)
class ServeOptions:
    """What `trt-spec serve` runs."""

    repository: Path
    http_port: int = defaults.HTTP_PORT
    grpc_port: int = defaults.GRPC_PORT
    metrics_port: int = defaults.METRICS_PORT
    host: str = defaults.HOST
    timeout: Optional[float] = None  # readiness; None: the repository's
    log_path: Optional[Path] = None
    admin_key_file: Optional[Path] = None
    openai_port: Optional[int] = None  # None: no OpenAI frontend
    openai_api_key_file: Optional[Path] = None
    openai_allow_unauthenticated: bool = False  # bind a non-loopback `host` even without a key
    openai_max_concurrent: int = defaults.OPENAI_MAX_CONCURRENT
    openai_max_queued: int = defaults.OPENAI_MAX_QUEUED
    openai_max_body_bytes: int = defaults.OPENAI_MAX_BODY_BYTES
    drain_timeout: float = defaults.DRAIN_TIMEOUT_S
    verbose: bool = False
    restart: str = "trt-spec serve"  # named when a model died

    @property
    def triton_grpc(self) -> str:
        return f"{loopback(self.host)}:{self.grpc_port}"

    @property
    def frontend_log(self) -> Path:
        return Path(f"{str(self.repository).rstrip('/')}.openai.{self.openai_port}.log")

    def openai_has_key(self, environ=None) -> bool:
        """Whether the frontend will ask for a key (file, or the inherited environment variable)."""
        import os

        env = os.environ if environ is None else environ
        return self.openai_api_key_file is not None or bool(env.get(defaults.OPENAI_API_KEY_ENV))

    def frontend_options(self) -> dict:
        """frontend_argv's options."""
        return dict(
            api_key_file=self.openai_api_key_file,
            max_concurrent=self.openai_max_concurrent,
            max_queued=self.openai_max_queued,
            max_body_bytes=self.openai_max_body_bytes,
        )


def loopback(host: str) -> str:
    """Where a process on this machine reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach a server bound to `host`."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to any interface


def openai_bind_host(host: str, has_key: bool, allow_unauthenticated: bool) -> str:
    """`host`, or loopback when the frontend would be open to the network without a key."""
    if has_key or allow_unauthenticated or is_loopback(host):
        return host
    return "127.0.0.1"


def loopback_note(o: ServeOptions, bind: str) -> Optional[str]:
    """The line saying the frontend was kept on loopback; None when it binds --host."""
    if bind == o.host:
        return None
    return (
        f"the OpenAI frontend binds {bind}:{o.openai_port} only, not {o.host}: it has no API key; give one "
        f"(--openai-api-key-file FILE, or env {defaults.OPENAI_API_KEY_ENV}) or --openai-allow-unauthenticated "
        "to expose it anyway"
    )


def _openai_bind(o: ServeOptions) -> str:
    return openai_bind_host(o.host, o.openai_has_key(), o.openai_allow_unauthenticated)


def _check_openai_key(o: ServeOptions) -> None:
    if o.openai_api_key_file is None:
        return
    if o.openai_port is None:
        raise ServerError("--openai-api-key-file needs --openai-port (the key guards the OpenAI frontend)")
    from .openai.guard import ApiKeyFileError, read_api_key

    try:
        read_api_key(o.openai_api_key_file)
    except ApiKeyFileError as e:
        raise ServerError(str(e)) from None


def dry_run(o: ServeOptions) -> list[str]:
    """The exact command line, then `# ` notes."""
    served = ServedRepository.load(o.repository)
    spec = launch_spec(
        served,
        http_port=o.http_port,
        grpc_port=o.grpc_port,
        metrics_port=o.metrics_port,
        host=o.host,
        verbose=o.verbose,
        admin_key_file=o.admin_key_file,
    )
    lines = [spec.shell(), *(f"# {note}" for note in spec.notes), f"# plain: {spec.plain}"]
    if spec.plain_backends is not None and not spec.plain_backends.is_dir():
        lines.append(
            f"# {spec.plain_backends}: trt-spec repo and trt-spec serve make it (nvidia-pytriton's backends "
            "and this interpreter's python-backend stub)"
        )
    if o.openai_port is not None:
        from ..records.procutil import shell_line
        from .openai.process import frontend_argv

        _check_openai_key(o)
        bind = _openai_bind(o)
        argv = frontend_argv(served.path, o.triton_grpc, o.openai_port, bind, **o.frontend_options())
        lines.append(f"# then, once it is ready: {shell_line(argv)}")
        note = loopback_note(o, bind)
        if note:
            lines.append(f"# {note}")
    return lines


@dataclass
class _Running:
    """The processes of one serve; the first signal once serving drains, any other stops at once."""

    drain: threading.Event = field(default_factory=threading.Event)
    server: Optional[TritonServer] = None
    frontend: Optional[object] = None  # openai.process.FrontendProcess
    served: Optional[ServedRepository] = None

    def on_signal(self, *_) -> None:
        if self.drain.is_set() or self.server is None or not self.server.is_serving:
            raise KeyboardInterrupt
        self.drain.set()

    def stop_all(self) -> None:
        if self.frontend is not None:
            self.frontend.stop()
        if self.server is not None:
            self.server.stop()


def _refuse_early(o: ServeOptions, run: _Running, err: Say = lambda line: None) -> None:
    """The checks before any process starts, so a mistake is one line, not one after a long load (the tensorrtllm
    backend does not verify its engines)."""
    from ..records.integrity import IntegrityError, verify_repository_engines

    _check_openai_key(o)
    run.served = ServedRepository.load(Path(o.repository))
    try:
        verify_repository_engines(run.served.path)
    except IntegrityError as e:
        raise ServerError(str(e)) from None
    if o.openai_port is not None:
        from ..repository.writer import RepositoryError
        from .openai.process import FrontendProcess

        bind = _openai_bind(o)
        try:
            run.frontend = FrontendProcess(
                run.served, o.triton_grpc, o.openai_port, bind, o.frontend_log, **o.frontend_options()
            )
        except RepositoryError as e:
            raise ServerError(str(e)) from None
        note = loopback_note(o, bind)
        if note:
            err(note)


def _start(o: ServeOptions, run: _Running, err: Say) -> None:
    run.server = TritonServer(
        run.served,
        http_port=o.http_port,
        grpc_port=o.grpc_port,
        metrics_port=o.metrics_port,
        host=o.host,
        verbose=o.verbose,
        log_path=o.log_path,
        admin_key_file=o.admin_key_file,
    )
    run.server.spec.prepare_plain()
    err(f"plain command: {run.server.spec.plain}")
    run.server.start()


def _serve_until_signal(o: ServeOptions, run: _Running, out: Say, err: Say) -> int:
    """Wait for ready, then watch once a second until a signal asks to drain; the exit code."""
    server, frontend = run.server, run.frontend
    server.wait_ready(o.timeout)
    ready = f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}"
    if frontend is not None:
        frontend.start().wait_ready()
        ready += f"  OpenAI {frontend.url}/v1"
    out(f"{ready}  (log {server.log_path}); Ctrl-C or SIGTERM drains and stops")
    server.is_serving = True
    while not run.drain.wait(1.0):
        if server.proc.poll() is not None:
            err(f"error: {server.failure(f'tritonserver exited with code {server.proc.returncode}')}")
            return 1
        if frontend is not None and frontend.proc.poll() is not None:
            err(
                f"error: the OpenAI frontend exited with code {frontend.proc.returncode} "
                f"({frontend.log_tail()}); its log: {frontend.log_path}"
            )
            return 1
        dead = server.dead_models()
        if dead:
            err(dead_models_message(dead, o.restart))
            return MODEL_DIED_EXIT
    drain(server, o.drain_timeout, err)
    return 0


def run(o: ServeOptions, *, out: Say, err: Say) -> int:
    """Serve until a signal: 0 stopped, 1 a process failed, MODEL_DIED_EXIT. ServerError before anything starts."""
    state = _Running()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(sig, state.on_signal)
    _refuse_early(o, state, err)
    try:
        _start(o, state, err)
    except KeyboardInterrupt:
        state.stop_all()
        err("stopped")
        return 0
    try:
        code = _serve_until_signal(o, state, out, err)
        state.stop_all()
    except (ServerError, RuntimeError) as e:
        err(f"error: {e}")
        state.stop_all()
        return 1
    except KeyboardInterrupt:  # a second signal, while draining or stopping too
        state.stop_all()
        code = 0
    if code == 0:
        err("stopped")
    return code


def drain(server: TritonServer, drain_timeout: float, err: Say) -> None:
    """Refuse new requests, let those in flight finish within drain_timeout, then end the rest with an error."""

    def idle_within(seconds: float) -> bool:
        deadline, zeros = time.monotonic() + seconds, 0
        while zeros < 2:  # two zero reads in a row: nothing between two steps of a request either
            if server.proc.poll() is not None:
                return True
            n = server.in_flight()
            zeros = zeros + 1 if n == 0 else 0
            if zeros < 2:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(defaults.DRAIN_POLL_S)
        return True

    t0 = time.monotonic()
    err(
        f"draining: new requests are refused; the {max(server.in_flight(), 0)} in flight get up to "
        f"{drain_timeout:.0f}s (a second signal stops at once)"
    )
    server.drain()
    if idle_within(drain_timeout):
        err(f"drained in {time.monotonic() - t0:.1f}s")
        return
    err(f"drain timeout ({drain_timeout:g}s): ending the {max(server.in_flight(), 0)} request(s) still running")
    server.cancel_in_flight()
    idle_within(defaults.DRAIN_CUT_GRACE_S)
