"""`trt-spec` command line: a thin Click shell over the plain functions of each stage."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import click

from .config import BuildConfig, ConfigError, load_config
from .hardware import HardwareError, resolve_gpu
from .preflight import PreflightError

USER_ERROR = 2  # bad config / failed preflight (before any expensive work)


class UserError(click.ClickException):
    exit_code = USER_ERROR

    def show(self, file=None) -> None:  # one clear line
        click.echo(f"error: {self.message}", err=True)


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _load(config: str, sets: tuple[str, ...]) -> BuildConfig:
    try:
        return load_config(config, sets)
    except ConfigError as e:
        raise UserError(str(e)) from None


def _plan_for(config: str, sets: tuple[str, ...], gpu: Optional[str], require_checkpoints: bool):
    from .plan import make_plan
    from .preflight import run_preflight

    cfg = _load(config, sets)
    try:
        gpu_spec = resolve_gpu(cfg.gpu, gpu) if cfg.engine == "tensorrt" else None
        report = run_preflight(cfg, gpu_spec, require_checkpoints=require_checkpoints)
    except (PreflightError, HardwareError) as e:
        raise UserError(str(e)) from None
    return make_plan(cfg, report, Path(config))


_set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                           help="Override a config key, e.g. --set target.checkpoint=/models/llama (repeatable).")
_gpu_option = click.option("--gpu", default=None, metavar="NAME[:COUNT]",
                           help="Plan for a named GPU (h100, h200, a100-80gb, l40s, ...) instead of the config/nvidia-smi.")


@click.group(context_settings={"show_default": True, "help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trt-spec")
def main() -> None:
    """trt-spec: speculative decoding on Triton Inference Server with TensorRT-LLM.

    config -> plan -> build -> repo -> serve -> check/bench.
    """


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@_gpu_option
@_set_option
@click.option("--format", "fmt", type=click.Choice(["text", "json", "sh"]), default="text",
              help="text for people, json for tools, sh for a runnable bash script.")
def plan(config: str, gpu: Optional[str], sets: tuple[str, ...], fmt: str) -> None:
    """Check CONFIG and print the build plan (runs nothing)."""
    p = _plan_for(config, sets, gpu, require_checkpoints=False)
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
@click.option("--dry-run", is_flag=True, help="Show which steps would run or are up to date; run nothing.")
@click.option("--force", is_flag=True, help="Rerun steps even when their outputs are up to date.")
@click.option("--only", metavar="STEP", default=None, help="Run a single step (its inputs must be built).")
def build(config: str, gpu: Optional[str], sets: tuple[str, ...], dry_run: bool, force: bool,
          only: Optional[str]) -> None:
    """Preflight CONFIG, then quantize/convert and build every engine (incremental, resumable)."""
    from rich.console import Console

    from .runner import BuildError, run_plan

    console = Console(stderr=True)
    p = _plan_for(config, sets, gpu, require_checkpoints=not dry_run)
    for w in p.report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for n in p.report.notes:
        console.print(f"note: {n}")
    if p.report.memory:
        console.print("memory plan per GPU:\n" + p.report.memory_table(), highlight=False)

    status = {"ctx": None}

    def on_event(event: str, step, i: int, n: int) -> None:
        if event == "skip":
            console.print(f"[{i}/{n}] {step.name}: up to date, skipped")
        elif event == "start":
            status["ctx"] = console.status(f"[{i}/{n}] {step.name}: {step.description} ...")
            status["ctx"].__enter__()
        elif event in ("done", "fail"):
            if status["ctx"] is not None:
                status["ctx"].__exit__(None, None, None)
                status["ctx"] = None
            mark = "[green]done[/]" if event == "done" else "[red]FAILED[/]"
            console.print(f"[{i}/{n}] {step.name}: {mark}")

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


@main.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Repository directory (default: BUILD_DIR/model_repo).")
@_gpu_option
@_set_option
def repo(source: str, out_dir: Optional[str], gpu: Optional[str], sets: tuple[str, ...]) -> None:
    """Write a Triton model repository from BUILD_DIR (its manifest.json) or from a CONFIG's plan."""
    from .repository import RepositoryError, manifest_for_config, write_repository
    from .runner import BuildError, load_manifest

    src = Path(source)
    try:
        if src.is_dir():
            manifest = load_manifest(src)
            default_out = src / "model_repo"
        else:
            try:
                manifest = manifest_for_config(src, sets, gpu)
            except ConfigError as e:
                raise UserError(str(e)) from None
            except (PreflightError, HardwareError) as e:
                raise UserError(str(e)) from None
            default_out = Path(manifest["config"].get("output_dir") or Path("build") / manifest["name"]) / "model_repo"
        dest = Path(out_dir) if out_dir else default_out
        configs = write_repository(manifest, dest)
    except (BuildError, RepositoryError) as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {dest} ({', '.join(sorted(configs))})")
    click.echo(f"serve it: trt-spec serve {dest}   (or: tritonserver --model-repository={dest.resolve()})")


@main.command()
@click.argument("repository", type=click.Path(file_okay=False))
@click.option("--http-port", default=8000, type=int, help="HTTP port.")
@click.option("--grpc-port", default=8001, type=int, help="gRPC port.")
@click.option("--metrics-port", default=8002, type=int, help="Metrics port.")
@click.option("--host", default="127.0.0.1", help="Address to bind (0.0.0.0 for all interfaces).")
@click.option("--timeout", default=180.0, type=float, help="Seconds to wait for readiness.")
@click.option("--dry-run", is_flag=True, help="Print the exact command line(s) and exit.")
@click.option("--verbose", is_flag=True, help="tritonserver --log-verbose=1.")
def serve(repository: str, http_port: int, grpc_port: int, metrics_port: int, host: str, timeout: float,
          dry_run: bool, verbose: bool) -> None:
    """Start tritonserver on REPOSITORY (mpirun for TP/PP > 1) and keep it running until Ctrl-C/SIGTERM."""
    import signal as _signal
    import time

    from .server import ServerError, TritonServer, launch_spec

    try:
        if dry_run:
            spec = launch_spec(Path(repository), http_port=http_port, grpc_port=grpc_port,
                               metrics_port=metrics_port, host=host, verbose=verbose)
            click.echo(spec.shell())
            click.echo(f"# plain: {spec.plain}")
            return
        server = TritonServer(Path(repository), http_port=http_port, grpc_port=grpc_port,
                              metrics_port=metrics_port, host=host, verbose=verbose)
        click.echo(f"plain command: {server.spec.plain}", err=True)
        server.start()
    except ServerError as e:
        raise UserError(str(e)) from None
    _signal.signal(_signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        server.wait_ready(timeout)
        click.echo(f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  (log {server.log_path}); Ctrl-C stops")
        while server.proc.poll() is None:
            time.sleep(0.5)
        _err(f"error: tritonserver exited with code {server.proc.returncode}; log tail:\n{server.log_tail()}")
        server.stop()
        sys.exit(1)
    except ServerError as e:
        _err(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        server.stop()
        _err("stopped")


@main.command()
def doctor() -> None:
    """Show what this machine has (GPU, TensorRT-LLM, tritonserver, ...) and what each gap blocks."""
    from .doctor import run_checks

    checks = run_checks()
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = "ok " if c.ok else "-- "
        line = f"{mark}{c.name:<{width}}  {c.detail}"
        if not c.ok:
            line += f"  (blocks: {c.blocks})"
        click.echo(line)


if __name__ == "__main__":  # pragma: no cover
    main()
