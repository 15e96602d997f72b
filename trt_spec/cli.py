"""`trt-spec` command line: a thin Click shell over the plain functions of each stage."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import click
from click.core import ParameterSource

from .records import defaults
from .records.speculation import POLICIES
from .records.config import BuildConfig, ConfigError, load_config
from .harness.prompts import PROMPT_SETS
from .builder.hardware import HardwareError
from .builder.preflight import PreflightError

USER_ERROR = 2  # bad config / failed preflight (before any expensive work)


class UserError(click.ClickException):
    exit_code = USER_ERROR

    def show(self, file=None) -> None:  # one clear line
        click.echo(f"error: {self.message}", err=True)


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _sigterm_as_ctrl_c() -> None:
    """SIGTERM unwinds like Ctrl-C, so a running server is stopped and its shared memory removed."""
    import signal

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _load(config: str, sets: tuple[str, ...]) -> BuildConfig:
    try:
        return load_config(config, sets)
    except ConfigError as e:
        raise UserError(str(e)) from None


def _plan_for(config: str, sets: tuple[str, ...], gpu: Optional[str], require_checkpoints: bool,
              allow_offload: Optional[bool] = False):
    from .builder.pipeline import plan_for

    cfg = _load(config, sets)
    try:
        return plan_for(cfg, Path(config), gpu, require_checkpoints=require_checkpoints, allow_offload=allow_offload)
    except (PreflightError, HardwareError) as e:
        raise UserError(str(e)) from None


class _Option(click.Option):
    """An option that may belong to one mode of a _ModeCommand, and whose extra names (old spellings that still
    work) may be kept out of --help."""

    def __init__(self, *args, mode: Optional[str | tuple[str, ...]] = None, hidden_aliases: bool = False, **kw):
        super().__init__(*args, **kw)
        self.mode = mode  # a mode, or a tuple of the modes it belongs to
        self.hidden_aliases = hidden_aliases

    def get_help_record(self, ctx: click.Context):
        if not self.hidden_aliases:
            return super().get_help_record(ctx)
        names, self.opts = self.opts, self.opts[:1]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = names


class _ModeCommand(click.Command):
    """A command that runs in one of several modes, each chosen by its own option. --help lists the options every
    mode takes, then each mode's under its own heading; check_mode refuses an option of a mode not chosen."""

    def __init__(self, *args, modes: dict[str, tuple[str, str]], **kw):
        super().__init__(*args, **kw)
        self.modes = modes  # mode -> (the option that chooses it, what it does)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)
        headings = {None: "Options (every mode)"}
        for p in params:  # options of several modes, under one heading naming them
            m = getattr(p, "mode", None)
            if isinstance(m, tuple):
                headings[m] = "With " + " or ".join(self.modes[x][0] for x in m)
        headings.update({m: f"With {sel} ({what})" for m, (sel, what) in self.modes.items()})
        for mode, heading in headings.items():
            rows = [r for p in params if getattr(p, "mode", None) == mode for r in [p.get_help_record(ctx)] if r]
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)

    def check_mode(self, ctx: click.Context, mode: str) -> None:
        for p in self.get_params(ctx):
            other = getattr(p, "mode", None)
            belongs = (other,) if not isinstance(other, tuple) else other
            if other is not None and mode not in belongs and \
                    ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT):
                where = " or ".join(self.modes[x][0] for x in belongs)
                raise UserError(f"{p.opts[0]} goes with {where}, not with {self.modes[mode][0]}; drop it")


def _set_opt(**kw):
    return click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                        help="Override a config key, e.g. --set target.checkpoint=/models/llama (repeatable).", **kw)


def _protocol_opt(**kw):
    return click.option("--protocol", type=click.Choice(defaults.PROTOCOLS), default=defaults.PROTOCOL,
                        help="How to reach --url.", **kw)


def _admin_key_opt(**kw):
    """check / bench / tune --admin-key-file: the key for the server's restricted APIs (the harness reads model
    configs, which `trt-spec serve` restricts)."""
    return click.option("--admin-key-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                        help="The admin key of the server at --url (the file `trt-spec serve --admin-key-file FILE` "
                             "was given): `trt-spec serve` restricts model configs to it. Default: the key a `trt-spec "
                             "serve` on this host left for --url's port.", **kw)


_set_option = _set_opt()
_gpu_option = click.option("--gpu", default=None, metavar="NAME[:COUNT]",
                           help="Plan for a named GPU (h100, h200, a100-80gb, l40s, ...) instead of the config/nvidia-smi.")
_offload_option = click.option("--allow-offload", is_flag=True,
                               help="Quantize a target bigger than the GPUs hold: accelerate offloads the rest to host "
                                    "memory (slow). Without it such a build is refused.")


def os_error_line(e: OSError) -> str:
    """One line for a disk or network error a user can fix: what failed on which path, and the fix."""
    import errno

    where = f"{e.filename}: " if e.filename else ""
    what = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "write somewhere you may write (another --out / output_dir / --log), or fix the permissions"
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space on that filesystem, or write somewhere else"
    elif e.errno in (errno.ENOENT, errno.ENOTDIR):
        fix = "check the path"
    elif isinstance(e, ConnectionError) or e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ETIMEDOUT):
        fix = "check --url and that the server is running (trt-spec serve)"
    else:
        fix = "check the path and try again"
    return f"{where}{what}; {fix}"


class _Main(click.Group):
    """Every command: a user's mistake (click's errors, UserError, an OSError) is one line and exit 2; anything else
    is ours: one line naming the log that holds the full trace, and exit 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt):
            raise
        except OSError as e:
            raise UserError(os_error_line(e)) from None
        except Exception as e:  # noqa: BLE001 - an internal fault: a line here, the trace in a file
            import tempfile
            import traceback

            fd, path = tempfile.mkstemp(prefix="trt-spec-error-", suffix=".log")
            with os.fdopen(fd, "w") as f:
                f.write(f"trt-spec {' '.join(sys.argv[1:])}\n")
                traceback.print_exception(type(e), e, e.__traceback__, file=f)
            click.echo(f"error: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                       f"the full trace is in {path} — please report it", err=True)
            sys.exit(1)


@click.group(cls=_Main, context_settings={"show_default": True, "help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trt-spec")
def main() -> None:
    """trt-spec: speculative decoding on Triton Inference Server with TensorRT-LLM.

    config -> plan -> build -> repo -> serve -> check/bench.
    """


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@_gpu_option
@_set_option
@_offload_option
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sh"]), default="text",
              help="text for people, json for tools, sh for a runnable bash script.")
def plan(config: str, gpu: Optional[str], sets: tuple[str, ...], allow_offload: bool, fmt: str) -> None:
    """Check CONFIG and print the build plan (runs nothing)."""
    # a plan builds nothing: a calibration that does not fit is a warning here (build refuses it without the flag)
    p = _plan_for(config, sets, gpu, require_checkpoints=False, allow_offload=allow_offload or None)
    if fmt == "json":
        click.echo(json.dumps(p.to_json(), indent=2))
    elif fmt == "sh":
        click.echo(p.to_sh(), nl=False)
    else:
        click.echo(p.to_text())


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@_gpu_option
@_set_option
@_offload_option
@click.option("--dry-run", is_flag=True, help="Show which steps would run or are up to date; run nothing.")
@click.option("--force", is_flag=True, help="Rerun steps even when their outputs are up to date.")
@click.option("--only", metavar="STEP", default=None, help="Run a single step (its inputs must be built).")
def build(config: str, gpu: Optional[str], sets: tuple[str, ...], allow_offload: bool, dry_run: bool, force: bool,
          only: Optional[str]) -> None:
    """Preflight CONFIG, then quantize/convert and build every engine (incremental, resumable)."""
    from rich.console import Console

    from .builder.runner import BuildError, run_plan

    console = Console(stderr=True)
    p = _plan_for(config, sets, gpu, require_checkpoints=not dry_run, allow_offload=allow_offload)
    for w in p.report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for n in p.report.notes:
        console.print(f"note: {n}")
    if p.report.memory:
        console.print("memory plan per GPU:\n" + p.report.memory_table(), highlight=False)

    watch = _StepWatch(console, Path(p.output_dir) / "logs")

    def on_event(event: str, step, i: int, n: int) -> None:
        if event == "skip":
            console.print(f"[{i}/{n}] {step.name}: up to date, skipped", soft_wrap=True)
        elif event == "start":
            watch.start(f"[{i}/{n}] {step.name}", step)
        elif event in ("done", "fail"):
            secs = watch.stop()
            mark = "[green]done[/]" if event == "done" else "[red]FAILED[/]"
            console.print(f"[{i}/{n}] {step.name}: {mark} in {secs:.0f}s", highlight=False, soft_wrap=True)

    try:
        res = run_plan(p, config_path=Path(config), dry_run=dry_run, force=force, only=only, on_event=on_event)
    except BuildError as e:
        _err(f"error: {e}")
        if e.tail:
            _err("--- log tail ---\n" + e.tail + "\n---")
        if e.rerun:
            _err(f"fix the problem, then rerun: {e.rerun}")
        sys.exit(1)
    except KeyboardInterrupt:
        _err("interrupted: no partial output was kept; rerun the same command to resume")
        sys.exit(130)
    if dry_run:
        for s in res.steps:
            click.echo(f"{s.name}: {s.status}")
        return
    ran = sum(1 for s in res.steps if s.status == "ran")
    click.echo(f"build {p.name}: {ran} step(s) ran, {len(res.steps) - ran} up to date"
               + (f"; manifest: {res.manifest}" if res.manifest else ""))


class _StepWatch:
    """A running build step on stderr: its name, description and log path at the start; then its elapsed time and the
    last line its tool wrote to the log (distillation epochs, EAGLE training steps, calibration batches), live on a
    terminal or as a plain line every PROGRESS_LINE_S x 3 elsewhere."""

    def __init__(self, console, log_dir: Path):
        self.console, self.log_dir = console, log_dir
        self._stop = None
        self._thread = None
        self.t0 = 0.0

    def start(self, label: str, step) -> None:
        import signal
        import threading
        import time

        log = self.log_dir / f"{step.name}.log"
        self.console.print(f"{label}: {step.description} (log: {log})", highlight=False, soft_wrap=True)
        self.t0, self._stop = time.monotonic(), threading.Event()
        status = self.console.status("") if self.console.is_terminal else None

        def tick() -> None:
            # Ctrl-C/SIGTERM/SIGHUP must land on the main thread: delivered to this one (or to rich's refresh thread,
            # started here so that it inherits the mask), they would leave the main thread blocked in waitpid until
            # the tool ended by itself (Python runs signal handlers on the main thread only)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
            if status is not None:
                status.start()
            period = 0.5 if status is not None else defaults.PROGRESS_LINE_S * 3
            while not self._stop.wait(period):
                text = f"{label}: {time.monotonic() - self.t0:.0f}s" + (f" — {last}" if (last := _last_line(log)) else "")
                if status is not None:
                    status.update(text)
                else:
                    self.console.print(text, highlight=False, markup=False, soft_wrap=True)
            if status is not None:
                status.stop()
        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        import time

        if self._stop is not None:
            self._stop.set()
            self._thread.join(timeout=2)
        return time.monotonic() - self.t0


def _last_line(log: Path, width: int = 100) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").replace("\r", "\n").splitlines()]
    except OSError:
        return ""
    last = next((ln for ln in reversed(lines) if ln), "")
    return last if len(last) <= width else last[: width - 1] + "…"


@main.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help=f"Repository directory (default: BUILD_DIR/{defaults.REPO_SUBDIR}).")
@click.option("--decoupled/--no-decoupled", default=True, show_default=True,
              help="Decoupled engine models and BLS (streaming). --no-decoupled: NVIDIA's DTM recipe, for clients "
                   "that call the models with unary infer (no streaming).")
@click.option("--max-queue-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="Requests an engine model queues for a batch slot before refusing new ones with the backend's "
                   "'Maximum queue size' error (dynamic_batching.default_queue_policy). 0 = unbounded.")
@_gpu_option
@_set_option
def repo(source: str, out_dir: Optional[str], decoupled: bool, max_queue_size: int, gpu: Optional[str],
         sets: tuple[str, ...]) -> None:
    """Write a Triton model repository from BUILD_DIR (its manifest.json) or from a CONFIG's plan."""
    from .records.manifest import ManifestError
    from .builder.pipeline import manifest_from
    from .repository.writer import RepositoryError, write_repository

    src = Path(source)
    try:
        manifest = manifest_from(src, sets, gpu)
        build_dir = src if src.is_dir() else manifest.config.resolved_output_dir(src)
        dest = Path(out_dir) if out_dir else build_dir / defaults.REPO_SUBDIR
        configs = write_repository(manifest, dest, decoupled=decoupled, max_queue_size=max_queue_size)
    except (ConfigError, PreflightError, HardwareError, ManifestError, RepositoryError) as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {dest} ({', '.join(sorted(configs))})")
    from .repository.llmapi import missing_sources

    for line in missing_sources(dest):  # runtime llmapi written where the image's model source is not
        click.echo(f"note: {line}")
    click.echo(f"serve it: trt-spec serve {dest}")
    plain = _plain_launch(dest, manifest.engine)
    if plain:
        click.echo(f"or start tritonserver yourself, from any directory: {plain}")


def _plain_launch(repo: Path, engine: str) -> Optional[str]:
    """The real launch of a written repository (mpirun, orchestrator variables, pools, backend directory; the NGC
    image's tritonserver for TensorRT engines), its backend directory prepared; None where no tritonserver is known."""
    from .serve.server import NGC_TRITONSERVER, ServerError, launch_spec

    try:
        spec = launch_spec(repo, binary=NGC_TRITONSERVER if engine == "tensorrt" else None)
        spec.prepare_plain()
    except ServerError:
        return None
    return spec.plain


@main.command()
@click.argument("repository", type=click.Path(file_okay=False))
@click.option("--http-port", default=defaults.HTTP_PORT, type=int, help="HTTP port.")
@click.option("--grpc-port", default=defaults.GRPC_PORT, type=int, help="gRPC port.")
@click.option("--metrics-port", default=defaults.METRICS_PORT, type=int, help="Metrics port.")
@click.option("--host", default=defaults.HOST,
              help="Address to bind (0.0.0.0 for all interfaces: inference, metadata, statistics and metrics are "
                   "then open to the network).")
@click.option("--timeout", default=None, type=float,
              help=f"Seconds to wait for the server and every model to be ready  [default: "
                   f"{defaults.READY_TIMEOUT_S:.0f} + {defaults.READY_S_PER_ENGINE_GIB:.0f} per GiB of engine files]")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="tritonserver's log (kept after stop)  [default: REPOSITORY.tritonserver.HTTP_PORT.log]")
@click.option("--admin-key-file", type=click.Path(dir_okay=False), default=None,
              help="Unlock the admin APIs (shared-memory, model-config, model-repository, trace, logging) for "
                   "requests whose header triton-admin-key (gRPC: triton-grpc-protocol-triton-admin-key) holds the key "
                   "in this file; a missing file is created with a random key, mode 0600. Without it the key is random. "
                   "Either way it is left, 0600, in trt-spec's cache for the HTTP and gRPC ports while the server runs "
                   "(check, bench and tune on this host find it there).")
@click.option("--openai-port", type=click.IntRange(1, 65535), default=None,
              help="Also serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /metrics) on this "
                   "port, in front of the server's gRPC port; models: ensemble (baseline), tensorrt_llm_bls "
                   "(speculative).")
@click.option("--drain-timeout", default=defaults.DRAIN_TIMEOUT_S, type=click.FloatRange(0, None), show_default=True,
              help="On SIGTERM/Ctrl-C: seconds the requests in flight get to finish (no new ones are admitted and "
                   "/v2/health/ready turns false meanwhile); then those left end with a clear error.")
@click.option("--dry-run", is_flag=True, help="Print the exact command line(s) and exit.")
@click.option("--verbose", is_flag=True, help="tritonserver --log-verbose=1.")
def serve(repository: str, http_port: int, grpc_port: int, metrics_port: int, host: str, timeout: Optional[float],
          log_path: Optional[str], admin_key_file: Optional[str], openai_port: Optional[int], drain_timeout: float,
          dry_run: bool, verbose: bool) -> None:
    """Start tritonserver on REPOSITORY (mpirun for TP/PP > 1) and keep it running until SIGTERM/Ctrl-C/SIGHUP.

    A signal drains: new requests are refused with a "shutting down" line and readiness turns false, the requests
    in flight finish (up to --drain-timeout, then they end with a clear error), then the server stops and the exit
    code is 0. A second signal stops at once. The server stops with this command, however it ends (kill -9
    included). If a model's python-backend process dies, the model can no longer answer: the server is stopped and
    the exit code is 3. Other exit codes: 1 the server failed or exited, 2 a bad argument or a busy port.
    """
    import shlex
    import signal
    import threading

    from .records.integrity import IntegrityError, verify_repository_engines
    from .serve.server import MODEL_DIED_EXIT, ServerError, TritonServer, dead_models_message, launch_spec

    if dry_run:
        try:
            spec = launch_spec(Path(repository), http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                               host=host, verbose=verbose, admin_key_file=admin_key_file)
        except ServerError as e:
            raise UserError(str(e)) from None
        click.echo(spec.shell())
        for note in spec.notes:
            click.echo(f"# {note}")
        click.echo(f"# plain: {spec.plain}")
        if spec.plain_backends is not None and not spec.plain_backends.is_dir():
            click.echo(f"# {spec.plain_backends}: trt-spec repo and trt-spec serve make it (nvidia-pytriton's backends "
                       "and this interpreter's python-backend stub)")
        if openai_port is not None:
            from .records.procutil import shell_line
            from .serve.openai_frontend import frontend_argv

            click.echo(f"# then, once it is ready: {shell_line(frontend_argv(Path(repository), f'{_loopback(host)}:{grpc_port}', openai_port, host))}")
        return
    drain = threading.Event()  # the first signal once serving: drain; any other signal: stop at once
    server = frontend = None

    def on_signal(*_):
        if drain.is_set() or server is None or not server.is_serving:
            raise KeyboardInterrupt
        drain.set()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(sig, on_signal)
    try:  # the engines are the ones the build made (the tensorrtllm backend itself does not check)
        verify_repository_engines(Path(repository))
    except IntegrityError as e:
        raise UserError(str(e)) from None
    if openai_port is not None:
        from .serve.openai_frontend import FrontendProcess
        from .repository.writer import RepositoryError

        try:  # before the server starts: a busy port or a repository it cannot serve is one line, at once
            frontend = FrontendProcess(Path(repository), f"{_loopback(host)}:{grpc_port}", openai_port, host,
                                       Path(f"{str(repository).rstrip('/')}.openai.{openai_port}.log"))
        except (RepositoryError, ServerError) as e:
            raise UserError(str(e)) from None

    def stop_all() -> None:
        if frontend is not None:
            frontend.stop()
        if server is not None:
            server.stop()
    try:
        server = TritonServer(Path(repository), http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                              host=host, verbose=verbose, log_path=log_path, admin_key_file=admin_key_file)
        server.spec.prepare_plain()
        click.echo(f"plain command: {server.spec.plain}", err=True)
        server.start()
    except ServerError as e:
        raise UserError(str(e)) from None
    except KeyboardInterrupt:
        stop_all()
        _err("stopped")
        return
    try:
        server.wait_ready(timeout)
        ready = f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}"
        if frontend is not None:
            frontend.start().wait_ready()
            ready += f"  OpenAI {frontend.url}/v1"
        click.echo(f"{ready}  (log {server.log_path}); Ctrl-C or SIGTERM drains and stops")
        server.is_serving = True
        while not drain.wait(1.0):
            if server.proc.poll() is not None:
                _err(f"error: {server.failure(f'tritonserver exited with code {server.proc.returncode}')}")
                stop_all()
                sys.exit(1)
            if frontend is not None and frontend.proc.poll() is not None:
                _err(f"error: the OpenAI frontend exited with code {frontend.proc.returncode} "
                     f"({frontend.log_tail()}); its log: {frontend.log_path}")
                stop_all()
                sys.exit(1)
            dead = server.dead_models()
            if dead:
                _err(dead_models_message(dead, "trt-spec " + shlex.join(sys.argv[1:])))
                stop_all()
                sys.exit(MODEL_DIED_EXIT)
        _drain(server, drain_timeout)
        stop_all()
        _err("stopped")
    except (ServerError, RuntimeError) as e:
        _err(f"error: {e}")
        stop_all()
        sys.exit(1)
    except KeyboardInterrupt:
        stop_all()
        _err("stopped")


def _drain(server, drain_timeout: float) -> None:
    """Refuse new requests, let those in flight finish (up to drain_timeout), then end the rest with a clear error."""
    import time

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
    _err(f"draining: new requests are refused; the {max(server.in_flight(), 0)} in flight get up to "
         f"{drain_timeout:.0f}s (a second signal stops at once)")
    server.drain()
    if idle_within(drain_timeout):
        _err(f"drained in {time.monotonic() - t0:.1f}s")
        return
    _err(f"drain timeout ({drain_timeout:.0f}s): ending the {max(server.in_flight(), 0)} request(s) still running")
    server.cancel_in_flight()
    idle_within(defaults.DRAIN_CUT_GRACE_S)


def _loopback(host: str) -> str:
    """Where a process on this machine reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _prompts(prompt_set: str, max_tokens: Optional[int], limit: Optional[int]):
    from .harness.prompts import load_prompts

    try:
        return load_prompts(prompt_set, max_tokens)[:limit]
    except ValueError as e:
        raise UserError(str(e)) from None


def _chat(prompts, tokenizer: Optional[str]):
    """The prompts wrapped in TOKENIZER's chat template (as an instruct model is served); unchanged without one, and
    then a plain note on stderr: the served repository's tokenizer lives on the server, so the client cannot apply
    its template by itself, and the template changes what is measured."""
    if not tokenizer:
        click.echo("note: prompts go out raw, without a chat template; an instruct model answers raw text "
                   "differently from its users' chat requests, and speculation pays differently on each. Pass "
                   "--tokenizer DIR (the target's tokenizer: tokenizer_dir in REPO/preprocessing/config.pbtxt)"
                   " to send them as chat requests.", err=True)
        return prompts
    from .harness.prompts import with_chat_template
    from .in_triton.serving import load_tokenizer

    return with_chat_template(prompts, load_tokenizer(tokenizer))


_tokenizer_help = "Wrap prompts in this tokenizer's chat template (as an instruct model is served)."


_wait_help = ("Wait up to this many seconds for a server that is not up or still loading (default: only while "
              f"the port answers but the models load, up to {defaults.LOADING_WAIT_S:.0f}s).")


def _client(url: str, protocol: str, wait: Optional[float] = None, admin_key_file: Optional[str] = None):
    """A client for the baseline and speculative models at url; one clear error if either is not ready (what is
    there instead, and the fix) after waiting up to `wait` seconds."""
    from .harness.client import ClientError, LLMClient, read_key_file
    from .records.names import TEXT_MODELS

    try:
        c = LLMClient(url, protocol, admin_key=read_key_file(admin_key_file) if admin_key_file else None)
        c.check_ready(list(TEXT_MODELS), wait)
        note = c.check_baseline()
        if note:
            _note(note)
    except ClientError as e:
        raise UserError(str(e)) from None
    return c


def _note(line: str) -> None:
    """A note on stderr (a phase switch of harness/phases.py, a check that was skipped)."""
    _err(f"note: {line}")


def _progress(console, total: int, label: str):
    """(context, callback(done)) for a long loop: a rich bar with elapsed time and ETA on stderr; where stderr is not a
    terminal (CI, a pipe), a plain line at most every PROGRESS_LINE_S and at the end instead."""
    import contextlib
    import time

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn)

    if console.is_terminal:
        prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), "ETA", TimeRemainingColumn(), console=console, transient=True)
        task = prog.add_task(label, total=total)
        return prog, (lambda done, *_: prog.update(task, completed=done))
    t0, last = time.monotonic(), [time.monotonic()]

    def line(done, *_):
        now = time.monotonic()
        if done < total and now - last[0] < defaults.PROGRESS_LINE_S:
            return
        last[0] = now
        eta = f", ~{(now - t0) / done * (total - done):.0f}s left" if 0 < done < total else ""
        click.echo(f"{label}: {done}/{total}, {now - t0:.0f}s{eta}", err=True)
    return contextlib.nullcontext(), line


_prompt_options = [  # --prompt-set: bench's old name, still accepted
    click.option("--prompts", "--prompt-set", "prompt_set", cls=_Option, hidden_aliases=True, metavar="SET|FILE",
                 default=defaults.PROMPT_SET, help=f"Prompt set ({', '.join(PROMPT_SETS)}), a JSONL file (one "
                 "{\"prompt\": ..., \"max_tokens\": ...} per line) or a ShareGPT-style JSON file."),
    click.option("--max-tokens", type=int, default=None, help="Override every prompt's max_tokens."),
    click.option("--limit", type=int, default=None, help="Use only the first N prompts."),
]
_url_help = ("Triton endpoint HOST:PORT: the server's gRPC port with --protocol grpc, its HTTP port with "
             "--protocol http.")
_report_help = "Write report.json, report.md and PNG plots here."


def _with(options):
    def deco(f):
        for o in reversed(options):
            f = o(f)
        return f
    return deco


@main.command()
@click.option("--url", default=defaults.URL, metavar="HOST:PORT", help=_url_help)
@_protocol_opt()
@_with(_prompt_options)
@click.option("--num-draft-tokens", type=int, default=None, help="k per request (default: the deployment's).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="Tokenizer dir: shows divergence context and enables the near-tie (top-2 logit margin) check.")
@click.option("--near-tie-margin", type=click.FloatRange(min=0, min_open=True), default=None, metavar="LOGITS",
              help="A divergence whose two tokens lie within this many logits of the baseline engine's best is a "
                   f"near-tie (reported apart, passes); anything else fails  [default: {defaults.NEAR_TIE_MARGIN} for "
                   f"a GPU engine, {defaults.NEAR_TIE_MARGIN_EXACT} for the CPU stand-in, whose numerics are exact]")
@click.option("--raw", is_flag=True, help="Send prompts as raw text (default with --tokenizer: its chat template).")
@click.option("--temperature", type=float, default=0.0,
              help="> 0: also a distribution-level (chi-square) check over seeded samples at this temperature.")
@click.option("--samples", type=int, default=defaults.SAMPLING_SAMPLES,
              help="Seeded samples per prompt and model for the distribution check.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS", help=_wait_help)
@_admin_key_opt()
def check(url: str, protocol: str, prompt_set: str, max_tokens: Optional[int], limit: Optional[int],
          num_draft_tokens: Optional[int], tokenizer: Optional[str], near_tie_margin: Optional[float], raw: bool,
          temperature: float, samples: int, fmt: str, wait: Optional[float], admin_key_file: Optional[str]) -> None:
    """Prove token-for-token identity of the speculative model against the baseline (exit 1 on a real mismatch)."""
    from rich.console import Console

    from .harness.client import ClientError
    from .harness.identity import format_check, greedy_measurement, sampling_measurement
    from .harness.phases import measure

    prompts = _prompts(prompt_set, max_tokens, limit)
    client = _client(url, protocol, wait, admin_key_file)
    tok = None
    if tokenizer:
        from .harness.prompts import with_chat_template
        from .in_triton.serving import load_tokenizer

        tok = load_tokenizer(tokenizer)
        client.use_tokenizer(tok)  # an LLM-API model returns text only: its tokens are this tokenizer's
        if not raw:
            prompts = with_chat_template(prompts, tok)
    console = Console(stderr=True)
    ms = [greedy_measurement(client, prompts, num_draft_tokens=num_draft_tokens, tokenizer=tok,
                             near_tie_margin=near_tie_margin)]
    if temperature > 0:
        ms.append(sampling_measurement(client, prompts, temperature=temperature, samples=samples,
                                       num_draft_tokens=num_draft_tokens))
    try:  # a baseline loaded for its phase only: one switch for both checks (harness/phases.py)
        rep, *dist = measure(client, ms, stage=lambda label, total: _progress(console, total, label), note=_note)
        for rows in dist:
            rep.distribution.extend(rows)
    except ClientError as e:
        raise UserError(str(e)) from None
    click.echo(json.dumps(rep.to_dict(), indent=2) if fmt == "json" else format_check(rep))
    sys.exit(0 if rep.passed else 1)


_BENCH_MODES = {"served": ("--url HOST:PORT", "a deployment served by Triton"),
                "openai": ("--openai URL", "any OpenAI-compatible server: trt-spec serve --openai-port, vLLM, SGLang, "
                                           "trtllm-serve, llama-server"),
                "in-process": ("--in-process CONFIG", "CONFIG's built reference engine, in this process, no server")}
_REMOTE = ("served", "openai")


def _served(*names, **kw):
    return click.option(*names, cls=_Option, mode="served", **kw)


def _remote(*names, **kw):
    return click.option(*names, cls=_Option, mode=_REMOTE, **kw)


def _openai(*names, **kw):
    return click.option(*names, cls=_Option, mode="openai", **kw)


def _in_process(*names, **kw):
    return click.option(*names, cls=_Option, mode="in-process", **kw)


@main.command(cls=_ModeCommand, modes=_BENCH_MODES)
@_with(_prompt_options)
@click.option("--k", "ks", multiple=True, type=int,
              help="Draft tokens per step (the cap under the adaptive policy); repeat to sweep (default: the "
                   "deployment's num_draft_tokens).")
@click.option("--repeats", type=int, default=1,
              help="Repetitions of the prompt set (the concurrency sweep sends prompts × repeats per level).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_served("--url", default=None, metavar="HOST:PORT", help=_url_help)
@_protocol_opt(cls=_Option, mode="served")
@_served("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS", help=_wait_help)
@_admin_key_opt(cls=_Option, mode="served")
@click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES),
              help="Draft-length policy per request, adaptive or fixed; repeat to compare (default: the deployment's).")
@_remote("--concurrency", "levels", multiple=True, type=click.IntRange(min=1),
         help="Also sweep these numbers of requests in flight (repeatable), at the first --k and --policy.")
@_remote("--request-rate", "rate", type=click.FloatRange(min=0, min_open=True), default=None, metavar="RPS",
         help="Also an open-loop run: requests at Poisson arrivals of RPS/s (seeded), to each model, with goodput.")
@_remote("--num-requests", type=click.IntRange(min=1), default=None,
         help="Requests per model of the --request-rate run (default: prompts x repeats).")
@_remote("--slo-ttft-ms", type=click.FloatRange(min=0), default=None, help="Goodput: a request meets the SLO only "
         "with TTFT at most this.")
@_remote("--slo-tpot-ms", type=click.FloatRange(min=0), default=None, help="Goodput: … and TPOT at most this.")
@_remote("--tokenizer", type=click.Path(file_okay=False), default=None, help=_tokenizer_help)
@_remote("--out", "out_dir", type=click.Path(file_okay=False), default=None, help=_report_help)
@_openai("--openai", "openai_urls", multiple=True, metavar="URL",
         help="http://HOST:PORT[/v1]; once (both models on it) or twice (the baseline's server, then the "
              "speculative one's).")
@_openai("--model", "models", multiple=True, help="Twice: the baseline's model name, then the speculative one's "
         "(default: trt-spec's, ensemble and tensorrt_llm_bls).")
@_openai("--api", type=click.Choice(["chat", "completions"]), default="chat",
         help="/v1/chat/completions (the server applies the chat template) or /v1/completions (raw prompts).")
@_openai("--api-key", default="none", envvar="OPENAI_API_KEY", show_envvar=True, help="Bearer token, if the server "
         "wants one.")
@_in_process("--in-process", "config", type=click.Path(dir_okay=False), default=None, metavar="CONFIG",
             help="The build config (built with `trt-spec build CONFIG`).")
@_in_process("--ignore-eos", is_flag=True, help="Generate exactly max_tokens (fixed-length benchmark).")
@_in_process("--threads", type=int, default=None, help="torch threads (default: torch's choice).")
@_in_process("--compare-hf", is_flag=True, help="Also time target-only greedy against HF generate.")
@_set_opt(cls=_Option, mode="in-process")
@click.pass_context
def bench(ctx: click.Context, **options) -> None:
    """Benchmark the speculative model against the baseline, paired (same prompts, alternating), in one of three modes.

    Served (--url): speedup with a 95% interval, acceptance, TTFT/TPOT, optionally a concurrency sweep, a request-rate
    run with goodput and report files. OpenAI (--openai): the same against any OpenAI-compatible server(s). In-process (--in-process CONFIG): the same speculative loop and policy over the reference engines in this
    process, no server: speedup, decode speedup, token identity, acceptance, the policy's per-round k counts, the
    draft/target cost ratio and the Leviathan bound.
    """
    o = BenchOptions(**options)
    chosen = [m for m, on in (("served", o.url), ("openai", o.openai_urls), ("in-process", o.config)) if on]
    if len(chosen) != 1:
        raise UserError("choose one: --url HOST:PORT (a Triton deployment), --openai URL (an OpenAI-compatible "
                        "server) or --in-process CONFIG (its reference engine, no server)")
    ctx.command.check_mode(ctx, chosen[0])
    (_bench_in_process if o.config else _bench_served)(o, _prompts(o.prompt_set, o.max_tokens, o.limit))


@dataclass(frozen=True)
class BenchOptions:
    """`trt-spec bench`'s options, as click parses them (the names of bench's parameters)."""

    prompt_set: str
    max_tokens: Optional[int]
    limit: Optional[int]
    ks: tuple[int, ...]
    repeats: int
    fmt: str
    policies: tuple[str, ...]
    url: Optional[str] = None  # served
    protocol: str = defaults.PROTOCOL
    wait: Optional[float] = None
    admin_key_file: Optional[str] = None
    levels: tuple[int, ...] = ()
    rate: Optional[float] = None
    num_requests: Optional[int] = None
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    tokenizer: Optional[str] = None
    out_dir: Optional[str] = None
    openai_urls: tuple[str, ...] = ()  # openai
    models: tuple[str, ...] = ()
    api: str = "chat"
    api_key: str = "none"
    config: Optional[str] = None  # in-process
    ignore_eos: bool = False
    threads: Optional[int] = None
    compare_hf: bool = False
    sets: tuple[str, ...] = ()


def _bench_in_process(o: BenchOptions, prompts: list) -> None:
    from .builder.runner import BuildError
    from .harness.inprocess import compare_hf, format_report, load_deployment, run_inprocess, to_json

    cfg = _load(o.config, o.sets)
    if o.threads:
        import torch

        torch.set_num_threads(o.threads)
    try:
        dep = load_deployment(cfg.resolved_output_dir(Path(o.config)))
    except (ValueError, BuildError) as e:
        raise UserError(str(e)) from None
    try:
        rep = run_inprocess(dep, prompts, list(o.ks) or [dep.default_k], repeats=o.repeats,
                            policies=list(o.policies) or [None], ignore_eos=o.ignore_eos,
                            progress=lambda s: click.echo(s, err=True) if o.fmt == "text" else None)
        if o.compare_hf:
            rep["lean_vs_hf"] = compare_hf(dep, prompts)
    except ValueError as e:  # the loop's request checks (RequestError), an engine's refusal (EngineError is not one)
        raise UserError(str(e)) from None
    finally:
        dep.close()
    click.echo(to_json(rep) if o.fmt == "json" else format_report(rep))


def _bench_served(o: BenchOptions, prompts: list) -> None:
    """Against a Triton deployment (--url) or OpenAI-compatible server(s) (--openai): the same runs and report."""
    from rich.console import Console

    from .harness.bench import SLO, ab_measurement, rate_measurement, sweep_measurement
    from .harness.client import ClientError
    from .harness.phases import measure
    from .harness.report import write_reports

    console = Console(stderr=True)
    if o.openai_urls:
        from .harness.openai_client import client_factory, endpoints

        try:
            roles = endpoints(o.openai_urls, o.models)
        except ValueError as e:
            raise UserError(str(e)) from None
        new_client = client_factory(roles, o.api, o.api_key)
        client, protocol = new_client(), f"openai {o.api}"
        try:
            client.check_ready(list(roles))
        except ClientError as e:
            raise UserError(str(e)) from None
        title = " vs ".join(f"{e.model} at {e.base_url}" for e in roles.values())
        if o.api == "completions":  # raw prompts: the chat template is the client's to apply (--tokenizer)
            prompts = _chat(prompts, o.tokenizer)
    else:
        client, protocol = _client(o.url, o.protocol, o.wait, o.admin_key_file), o.protocol
        if o.tokenizer:
            from .in_triton.serving import load_tokenizer

            client.use_tokenizer(load_tokenizer(o.tokenizer))
        new_client = client.clone
        title = f"{o.url} ({o.protocol})"
        prompts = _chat(prompts, o.tokenizer)
    # every measurement of the run; a baseline loaded for its phase only: one switch for all (harness/phases.py)
    k0, policy0 = (o.ks[0] if o.ks else None), (o.policies[0] if o.policies else None)
    ms = [ab_measurement(client, prompts, k=k, repeats=o.repeats, policy=policy)
          for policy in (list(o.policies) or [None]) for k in (list(o.ks) or [None])]
    n_ab = len(ms)
    if o.levels:
        ms.append(sweep_measurement(new_client, prompts, o.levels, k=k0, requests_per_level=len(prompts) * o.repeats,
                                    policy=policy0))
    if o.rate is not None:
        slo = SLO(o.slo_ttft_ms / 1e3 if o.slo_ttft_ms is not None else None,
                  o.slo_tpot_ms / 1e3 if o.slo_tpot_ms is not None else None)
        ms.append(rate_measurement(new_client, prompts, o.rate, o.num_requests or len(prompts) * o.repeats, k=k0,
                                   policy=policy0, slo=slo))
    try:
        results = measure(client, ms, stage=lambda label, total: _progress(console, total, label), note=_note)
    except ClientError as e:
        raise UserError(str(e)) from None
    runs = [{"protocol": protocol, **res} for res in results[:n_ab]]
    conc = results[n_ab] if o.levels else []
    rate = results[-1] if o.rate is not None else None
    rep = {"title": f"bench {title}", "bench": runs, "concurrency": conc, **({"rate": rate} if rate else {})}
    if o.out_dir:
        for f in write_reports(rep, Path(o.out_dir)):
            console.print(f"wrote {f}")
    if o.fmt == "json":
        click.echo(json.dumps(rep, indent=2, default=float))
    else:
        from .harness.report import markdown, environment

        click.echo(markdown({**rep, "environment": environment()}))


@main.command()
@click.option("--url", default=defaults.URL, metavar="HOST:PORT", help=_url_help)
@_protocol_opt()
@_with(_prompt_options)
@click.option("--k", "ks", multiple=True, type=int, default=defaults.TUNE_KS,
              help="Fixed k values to try (repeatable); the adaptive policy then runs capped at the largest.")
@click.option("--repeats", type=int, default=1, help="Repetitions of the prompt set per k.")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None, help=_tokenizer_help)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help=_report_help)
@click.option("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS", help=_wait_help)
@_admin_key_opt()
def tune(url: str, protocol: str, prompt_set: str, max_tokens: Optional[int], limit: Optional[int],
         ks: tuple[int, ...], repeats: int, tokenizer: Optional[str], out_dir: Optional[str],
         wait: Optional[float], admin_key_file: Optional[str]) -> None:
    """Sweep fixed num_draft_tokens (k), then the adaptive policy, against a served deployment; recommend a k and
    report adaptive against the best fixed k (speedups with 95% intervals, one run)."""
    from rich.console import Console

    from .harness.bench import tune_k
    from .harness.client import ClientError
    from .harness.report import environment, markdown, write_reports

    prompts = _prompts(prompt_set, max_tokens, limit)
    client = _client(url, protocol, wait, admin_key_file)
    prompts = _chat(prompts, tokenizer)
    sweep = list(ks)
    console = Console(stderr=True)
    try:
        prog, cb = _progress(console, len(sweep) + 1, "k sweep (fixed, then adaptive)")
        with prog:
            res = tune_k(client, prompts, sweep, repeats=repeats, progress=cb, note=_note)
    except ClientError as e:
        raise UserError(str(e)) from None
    rep = {"title": f"tune {url}", "tune": res}
    if out_dir:
        write_reports(rep, Path(out_dir))
    click.echo(markdown({**rep, "environment": environment()}))


@main.command(help=f"End to end on this machine: build CONFIG (default: {defaults.DEMO_CONFIG}), repo, serve, "
                   "check and bench over HTTP and gRPC, a concurrency sweep over gRPC, reports, stop.")
@click.argument("config", type=click.Path(dir_okay=False), default=defaults.DEMO_CONFIG)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=defaults.DEMO_OUT,
              help="Where the repository, server log and reports go.")
def demo(config: str, out_dir: str) -> None:
    from .demo import format_verdict, run_demo
    from .harness.client import ClientError
    from .records.manifest import ManifestError
    from .builder.runner import BuildError
    from .serve.server import ServerError

    _sigterm_as_ctrl_c()
    try:
        rep = run_demo(Path(config), Path(out_dir), say=lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        _err("interrupted: the server was stopped")
        sys.exit(130)
    except ConfigError as e:
        raise UserError(str(e)) from None
    except (PreflightError, BuildError, ManifestError, ServerError, ClientError) as e:
        _err(f"error: {e}")
        sys.exit(1)
    click.echo(format_verdict(rep))
    sys.exit(0 if rep["passed"] else 1)


@main.group()
def deploy() -> None:
    """Deployment bundles for the GPU deployment a build (or a config's plan) describes."""


@deploy.command("k8s")
@click.argument("source", type=click.Path())
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Chart directory to write (Chart.yaml, values.yaml, templates/, prometheus-adapter-values.yaml).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per node of the cluster; a plan needing more runs as a LeaderWorkerSet group  "
                   "[default: the GPU count the plan was made for]")
@click.option("--min-acceptance", type=click.FloatRange(0.0, 1.0), default=None,
              help="Alert threshold on accepted/drafted draft tokens  [default: break-even c + (r-1)/k, r = "
                   f"{defaults.VERIFY_COST_GPU}]")
@_gpu_option
@_set_option
def k8s(source: str, out_dir: str, gpus_per_node: Optional[int], min_acceptance: Optional[float],
        gpu: Optional[str], sets: tuple[str, ...]) -> None:
    """Write a Helm chart for BUILD_DIR (its manifest.json) or CONFIG (its plan): pinned NGC image, build Job into a
    PersistentVolumeClaim, Deployment (or LeaderWorkerSet), Service, PodMonitor, HPA, PodDisruptionBudget and an
    acceptance alert."""
    from .deploy.k8s import ADAPTER_VALUES, DeployError, write_chart

    try:
        out = write_chart(Path(source), Path(out_dir), gpus_per_node=gpus_per_node, min_acceptance=min_acceptance,
                          sets=sets, gpu=gpu)
    except (DeployError, ConfigError, PreflightError, HardwareError) as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {out} (Helm chart) and {out / ADAPTER_VALUES}")
    click.echo(f"install: helm install NAME {out}   (render first: helm template NAME {out})")


@main.command()
def doctor() -> None:
    """Show what this machine has (GPU, TensorRT-LLM, tritonserver, ...) and what each gap blocks."""
    from .doctor import run_checks

    checks = run_checks(say=lambda m: click.echo(m, err=True))
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = "ok " if c.ok else "-- "
        line = f"{mark}{c.name:<{width}}  {c.detail}"
        if not c.ok:
            line += f"  (blocks: {c.blocks})"
        click.echo(line)
    fatal = next((c for c in checks if c.fatal), None)
    if fatal is not None:
        raise UserError(fatal.detail)


@main.command(help="GPU host: the single-GPU chain on SmolLM2-135M in minutes (doctor; build, repo, the plain launch "
                   "from another directory, serve, NVIDIA's clients, check and bench for runtime engine, then its "
                   "llmapi twin); writes OUT/report.md and report.json: "
                   "every link ok, or the first failure of each chain with the log lines that matter. `make gpu-smoke`.")
@click.option("--gpu", default="auto", show_default=True, metavar="NAME[:COUNT]",
              help="The GPU to plan for (auto: nvidia-smi), e.g. h100:1.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="build/gpu-smoke", show_default=True)
@click.option("--calib-dataset", type=click.Path(file_okay=False), default=None,
              help="Local calibration set for quantize.py (default: the one trt-spec ships).")
@click.option("--engine-config", type=click.Path(dir_okay=False), default="build_configs/smollm2-first-contact-fp8.yaml",
              show_default=True)
@click.option("--llmapi-config", type=click.Path(dir_okay=False),
              default="build_configs/smollm2-first-contact-llmapi.yaml", show_default=True)
def smoke(gpu: str, out_dir: str, calib_dataset: Optional[str], engine_config: str, llmapi_config: str) -> None:
    from .gpu_smoke import SmokeSettings, run_smoke

    _sigterm_as_ctrl_c()
    rep = run_smoke(SmokeSettings(engine_config=engine_config, llmapi_config=llmapi_config, out_dir=out_dir, gpu=gpu,
                                  calib_dataset=calib_dataset), say=lambda m: click.echo(m, err=True))
    for chain in rep.chains:
        click.echo(f"{chain}: {rep.chain_verdict(chain)}")
    click.echo(f"report: {Path(out_dir) / 'report.md'}")
    sys.exit(0 if rep.ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
