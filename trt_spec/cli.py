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
@click.option("--decoupled/--no-decoupled", default=True, show_default=True,
              help="Decoupled engine models and BLS (streaming). --no-decoupled: NVIDIA's DTM recipe, for clients "
                   "that call the models with unary infer (no streaming).")
@_gpu_option
@_set_option
def repo(source: str, out_dir: Optional[str], decoupled: bool, gpu: Optional[str], sets: tuple[str, ...]) -> None:
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
        configs = write_repository(manifest, dest, decoupled=decoupled)
    except (BuildError, RepositoryError) as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {dest} ({', '.join(sorted(configs))})")
    click.echo(f"serve it: trt-spec serve {dest}   (or: tritonserver --model-repository={dest.resolve()})")


@main.command()
@click.argument("repository", type=click.Path(file_okay=False))
@click.option("--http-port", default=8000, type=int, help="HTTP port.")
@click.option("--grpc-port", default=8001, type=int, help="gRPC port.")
@click.option("--metrics-port", default=8002, type=int, help="Metrics port.")
@click.option("--host", default="127.0.0.1",
              help="Address to bind (0.0.0.0 for all interfaces: inference, metadata, statistics and metrics are "
                   "then open to the network).")
@click.option("--timeout", default=180.0, type=float, help="Seconds to wait for readiness.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="tritonserver's log (kept after stop)  [default: REPOSITORY/../NAME.tritonserver.log]")
@click.option("--admin-key-file", type=click.Path(dir_okay=False), default=None,
              help="Unlock the admin APIs (shared-memory, model-repository, trace, logging) for requests whose header "
                   "triton-admin-key (gRPC: triton-grpc-protocol-triton-admin-key) holds the key in this file; a "
                   "missing file is created with a random key, mode 0600. Without it they are refused.")
@click.option("--dry-run", is_flag=True, help="Print the exact command line(s) and exit.")
@click.option("--verbose", is_flag=True, help="tritonserver --log-verbose=1.")
def serve(repository: str, http_port: int, grpc_port: int, metrics_port: int, host: str, timeout: float,
          log_path: Optional[str], admin_key_file: Optional[str], dry_run: bool, verbose: bool) -> None:
    """Start tritonserver on REPOSITORY (mpirun for TP/PP > 1) and keep it running until Ctrl-C/SIGTERM/SIGHUP.

    The server stops with this command, however it ends (kill -9 included). If a model's python-backend process
    dies, the model can no longer answer: the server is stopped and the exit code is 3. Other exit codes: 0 stopped
    by a signal, 1 the server failed or exited, 2 a bad argument or a busy port.
    """
    import shlex
    import signal
    import time

    from .integrity import IntegrityError, verify_repository_engines
    from .server import MODEL_DIED_EXIT, ServerError, TritonServer, dead_models_message, launch_spec

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
        return
    _sigterm_as_ctrl_c()
    signal.signal(signal.SIGHUP, signal.getsignal(signal.SIGTERM))  # terminal closed: stop cleanly as well
    server = None
    try:  # the engines are the ones the build made (the tensorrtllm backend itself does not check)
        verify_repository_engines(Path(repository))
    except IntegrityError as e:
        raise UserError(str(e)) from None
    try:
        server = TritonServer(Path(repository), http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                              host=host, verbose=verbose, log_path=log_path, admin_key_file=admin_key_file)
        click.echo(f"plain command: {server.spec.plain}", err=True)
        server.start()
    except ServerError as e:
        raise UserError(str(e)) from None
    except KeyboardInterrupt:
        if server is not None:
            server.stop()
        _err("stopped")
        return
    try:
        server.wait_ready(timeout)
        click.echo(f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  (log {server.log_path}); Ctrl-C stops")
        while True:
            if server.proc.poll() is not None:
                _err(f"error: {server.failure(f'tritonserver exited with code {server.proc.returncode}')}")
                server.stop()
                sys.exit(1)
            dead = server.dead_models()
            if dead:
                _err(dead_models_message(dead, "trt-spec " + shlex.join(sys.argv[1:])))
                server.stop()
                sys.exit(MODEL_DIED_EXIT)
            time.sleep(1.0)
    except ServerError as e:
        _err(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        server.stop()
        _err("stopped")


def _prompts(prompt_set: str, max_tokens: Optional[int], limit: Optional[int]):
    from .harness.prompts import load_prompts

    try:
        return load_prompts(prompt_set, max_tokens)[:limit]
    except ValueError as e:
        raise UserError(str(e)) from None


def _client(url: str, protocol: str, models: tuple[str, ...] = ("ensemble", "tensorrt_llm_bls")):
    from .harness.client import ClientError, LLMClient

    c = LLMClient(url, protocol)
    try:
        c.check_ready(list(models))
    except ClientError as e:
        raise UserError(str(e)) from None
    return c


def _progress(console, total: int, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    prog = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)
    task = prog.add_task(label, total=total)
    return prog, (lambda done, *_: prog.update(task, completed=done))


_prompt_options = [
    click.option("--prompts", "prompt_set", default="code-edit",
                 help="Prompt set (code-edit, code, chat, summarization) or a JSONL file {\"prompt\", \"max_tokens\"}."),
    click.option("--max-tokens", type=int, default=None, help="Override every prompt's max_tokens."),
    click.option("--limit", type=int, default=None, help="Use only the first N prompts."),
]


def _with(options):
    def deco(f):
        for o in reversed(options):
            f = o(f)
        return f
    return deco


@main.command()
@click.option("--url", default="127.0.0.1:8001", help="Triton endpoint HOST:PORT (gRPC or HTTP port).")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc")
@_with(_prompt_options)
@click.option("--num-draft-tokens", type=int, default=None, help="k per request (default: the deployment's).")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="Tokenizer dir: shows divergence context and enables the near-tie (top-2 logit margin) check.")
@click.option("--raw", is_flag=True, help="Send prompts as raw text (default with --tokenizer: its chat template).")
@click.option("--temperature", type=float, default=0.0, help="> 0: distribution-level check over seeded samples.")
@click.option("--samples", type=int, default=200, help="Samples per prompt for the distribution check.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def check(url: str, protocol: str, prompt_set: str, max_tokens: Optional[int], limit: Optional[int],
          num_draft_tokens: Optional[int], tokenizer: Optional[str], raw: bool, temperature: float, samples: int,
          fmt: str) -> None:
    """Prove token-for-token identity of the speculative model against the baseline (exit 1 on a real mismatch)."""
    from rich.console import Console

    from .harness.client import ClientError
    from .harness.identity import check_greedy, check_sampling, format_check

    prompts = _prompts(prompt_set, max_tokens, limit)
    client = _client(url, protocol)
    tok = None
    if tokenizer:
        from .harness.prompts import with_chat_template
        from .serving import load_tokenizer

        tok = load_tokenizer(tokenizer)
        if not raw:
            prompts = with_chat_template(prompts, tok)
    console = Console(stderr=True)
    try:
        prog, cb = _progress(console, len(prompts), f"identity ({protocol})")
        with prog:
            rep = check_greedy(client, prompts, num_draft_tokens=num_draft_tokens, tokenizer=tok, progress=cb)
        if temperature > 0:
            prog, cb = _progress(console, len(prompts), f"sampling T={temperature}")
            with prog:
                check_sampling(client, prompts, rep, temperature=temperature, samples=samples,
                               num_draft_tokens=num_draft_tokens, progress=cb)
    except ClientError as e:
        raise UserError(str(e)) from None
    click.echo(json.dumps(rep.to_dict(), indent=2) if fmt == "json" else format_check(rep))
    sys.exit(0 if rep.passed else 1)


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--in-process", "in_process", is_flag=True,
              help="Benchmark the built reference engine of CONFIG in this process (no server).")
@click.option("--url", default=None, help="Benchmark a served deployment at HOST:PORT instead.")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc")
@click.option("--prompt-set", "prompt_set", default="code-edit",
              help="code-edit, code, chat, summarization, or a JSONL file.")
@click.option("--max-tokens", type=int, default=None, help="Override every prompt's max_tokens.")
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--k", "ks", multiple=True, type=int, help="Draft tokens per step; repeat to sweep (default: max_draft_len).")
@click.option("--repeats", type=int, default=1, help="Repetitions of the prompt set.")
@click.option("--concurrency", "levels", multiple=True, type=int, help="Served: concurrency sweep levels (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="In-process: generate exactly max_tokens (fixed-length benchmark).")
@click.option("--threads", type=int, default=None, help="In-process: torch threads (default: torch's choice).")
@click.option("--compare-hf", is_flag=True, help="In-process: also time target-only greedy against HF generate.")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None,
              help="Served: wrap prompts in this tokenizer's chat template (as an instruct model is served).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Served: write report.{json,md,png} here.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_set_option
def bench(config: Optional[str], in_process: bool, url: Optional[str], protocol: str, prompt_set: str,
          max_tokens: Optional[int], limit: Optional[int], ks: tuple[int, ...], repeats: int, levels: tuple[int, ...],
          ignore_eos: bool, threads: Optional[int], compare_hf: bool, tokenizer: Optional[str], out_dir: Optional[str], fmt: str, sets: tuple[str, ...]) -> None:
    """Measure speculative vs baseline: speedup, acceptance, TTFT/TPOT, cost ratio, Leviathan bound, identity."""
    if in_process == bool(url):
        raise UserError("choose one: --in-process CONFIG (reference engine, no server) or --url HOST:PORT (served)")
    prompts = _prompts(prompt_set, max_tokens, limit)
    if in_process:
        if config is None:
            raise UserError("--in-process needs CONFIG, e.g. trt-spec bench --in-process build_configs/cpu-smollm2-ngram.yaml")
        from .harness.inprocess import format_report, load_deployment, run_inprocess, to_json
        from .runner import BuildError

        cfg = _load(config, sets)
        if threads:
            import torch

            torch.set_num_threads(threads)
        try:
            dep = load_deployment(cfg.resolved_output_dir(Path(config)))
            rep = run_inprocess(dep, prompts, list(ks) or [dep.max_draft_len], repeats=repeats, ignore_eos=ignore_eos,
                                progress=lambda s: click.echo(s, err=True) if fmt == "text" else None)
            if compare_hf:
                from .harness.inprocess import compare_hf as _compare_hf

                rep["lean_vs_hf"] = _compare_hf(dep, prompts)
        except (ValueError, BuildError) as e:
            raise UserError(str(e)) from None
        click.echo(to_json(rep) if fmt == "json" else format_report(rep))
        return
    from rich.console import Console

    from .harness.bench import concurrency_sweep, paired_ab
    from .harness.client import ClientError, LLMClient
    from .harness.report import write_reports

    console = Console(stderr=True)
    client = _client(url, protocol)
    if tokenizer:
        from .harness.prompts import with_chat_template
        from .serving import load_tokenizer

        prompts = with_chat_template(prompts, load_tokenizer(tokenizer))
    runs = []
    try:
        for k in (list(ks) or [None]):
            prog, cb = _progress(console, len(prompts) * repeats, f"A/B k={k if k is not None else 'default'}")
            with prog:
                res = paired_ab(client, prompts, k=k, repeats=repeats, progress=cb)
            runs.append({"protocol": protocol, **res})
        conc = []
        if levels:
            prog, cb = _progress(console, 2 * len(levels), "concurrency sweep")
            with prog:
                conc = concurrency_sweep(lambda: LLMClient(url, protocol), prompts, levels, k=ks[0] if ks else None,
                                         progress=cb)
    except ClientError as e:
        raise UserError(str(e)) from None
    rep = {"title": f"bench {url} ({protocol})", "bench": runs, "concurrency": conc}
    if out_dir:
        for f in write_reports(rep, Path(out_dir)):
            console.print(f"wrote {f}")
    if fmt == "json":
        click.echo(json.dumps(rep, indent=2, default=float))
    else:
        from .harness.report import markdown, environment

        click.echo(markdown({**rep, "environment": environment()}))


@main.command()
@click.option("--url", default="127.0.0.1:8001", help="Triton endpoint HOST:PORT.")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc")
@_with(_prompt_options)
@click.option("--k", "ks", multiple=True, type=int, help="k values to try (default 1 2 4 and max).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Write report files here.")
def tune(url: str, protocol: str, prompt_set: str, max_tokens: Optional[int], limit: Optional[int],
         ks: tuple[int, ...], out_dir: Optional[str]) -> None:
    """Sweep num_draft_tokens (k) against a served deployment and recommend one."""
    from rich.console import Console

    from .harness.bench import tune_k
    from .harness.client import ClientError
    from .harness.report import environment, markdown, write_reports

    prompts = _prompts(prompt_set, max_tokens, limit)
    client = _client(url, protocol)
    sweep = list(ks) or [1, 2, 4]
    console = Console(stderr=True)
    try:
        prog, cb = _progress(console, len(sweep), "k sweep")
        with prog:
            res = tune_k(client, prompts, sweep, progress=cb)
    except ClientError as e:
        raise UserError(str(e)) from None
    rep = {"title": f"tune {url}", "tune": res}
    if out_dir:
        write_reports(rep, Path(out_dir))
    click.echo(markdown({**rep, "environment": environment()}))


@main.command()
@click.argument("config", type=click.Path(dir_okay=False), default="build_configs/cpu-smollm2-ngram.yaml")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="build/demo",
              help="Where the repository, server log and reports go.")
def demo(config: str, out_dir: str) -> None:
    """End to end on this machine: build, repo, serve, check + bench over HTTP and gRPC, reports, stop."""
    from .demo import format_verdict, run_demo
    from .harness.client import ClientError
    from .runner import BuildError
    from .server import ServerError

    _sigterm_as_ctrl_c()
    try:
        rep = run_demo(Path(config), Path(out_dir), say=lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        _err("interrupted: the server was stopped")
        sys.exit(130)
    except ConfigError as e:
        raise UserError(str(e)) from None
    except (PreflightError, BuildError, ServerError, ClientError) as e:
        _err(f"error: {e}")
        sys.exit(1)
    click.echo(format_verdict(rep))
    sys.exit(0 if rep["passed"] else 1)


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
