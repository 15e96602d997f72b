"""`trt-spec` command line: a thin Click shell, each command calling one stage function. Slow modules are imported
inside the command that needs them, so `--help` stays quick."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import click

from .builder.pipeline import manifest_from, plan_for
from .builder.progress import StepWatch
from .builder.runner import BuildError, run_plan
from .deploy.dynamo import FRONTEND_PORT as DYNAMO_PORT
from .deploy.k8s import ADAPTER_VALUES, write_chart
from .doctor import run_checks
from .errors import TrtSpecError
from .gpu_smoke import SmokeSettings, run_smoke
from .harness import commands
from .harness.bench import tune_k
from .harness.identity import format_check
from .harness.prompts import PROMPT_SETS, TURNS, default_turns, load_prompts, select_prompts
from .harness.report import environment, markdown, write_reports
from .records import defaults
from .records import llmapi_contract as lc
from .records.config import ConfigError, load_config
from .records.speculation import POLICIES
from .serve import supervisor
from .serve.launch import plain_launch

USER_ERROR = 2  # a user's mistake, before any expensive work


class UserError(click.ClickException):
    exit_code = USER_ERROR

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _err(msg: str) -> None:
    click.echo(msg, err=True)


def _note(line: str) -> None:
    _err(f"note: {line}")


def _sigterm_as_ctrl_c() -> None:
    """SIGTERM unwinds like Ctrl-C, so a running server is stopped and cleaned up."""

    def _raise(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def _plan_for(
    config: str,
    sets: tuple[str, ...],
    gpu: Optional[str],
    require_checkpoints: bool,
    allow_offload: Optional[bool] = False,
):
    cfg = load_config(config, sets)
    return plan_for(cfg, Path(config), gpu, require_checkpoints=require_checkpoints, allow_offload=allow_offload)


def os_error_line(e: OSError) -> str:
    """One line for a disk or network error a user can fix."""
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
    """A user's mistake is one line and exit 2; anything else one line naming the trace's log, and exit 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt):
            raise
        except TrtSpecError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            raise UserError(os_error_line(e)) from None
        except Exception as e:  # noqa: BLE001 - an internal fault: a line here, the trace in a file
            import tempfile
            import traceback

            fd, path = tempfile.mkstemp(prefix="trt-spec-error-", suffix=".log")
            with os.fdopen(fd, "w") as f:
                f.write(f"trt-spec {' '.join(sys.argv[1:])}\n")
                traceback.print_exception(type(e), e, e.__traceback__, file=f)
            click.echo(
                f"error: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                f"the full trace is in {path} — please report it",
                err=True,
            )
            sys.exit(1)


def _with(*options):
    def deco(f):
        for o in reversed(options):
            f = o(f)
        return f

    return deco


_url_help = (
    "Triton endpoint HOST:PORT: the server's gRPC port with --protocol grpc, its HTTP port with --protocol http."
)
_report_help = "Write report.json, report.md and PNG plots here."
_tokenizer_help = "Wrap prompts in this tokenizer's chat template (as an instruct model is served)."
_wait_help = (
    "Wait up to this many seconds for a server that is not up or still loading (default: only while "
    f"the port answers but the models load, up to {defaults.LOADING_WAIT_S:.0f}s)."
)

_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key, e.g. --set target.checkpoint=/models/llama (repeatable).",
)
_gpu_option = click.option(
    "--gpu",
    default=None,
    metavar="NAME[:COUNT]",
    help="Plan for a named GPU (h100, h200, a100-80gb, l40s, ...) instead of the config/nvidia-smi.",
)
_offload_option = click.option(
    "--allow-offload",
    is_flag=True,
    help="Quantize a target bigger than the GPUs hold: accelerate offloads the rest to host "
    "memory (slow). Without it such a build is refused.",
)
_prompt_options = _with(
    click.option(
        "--prompts",
        "prompt_set",
        metavar="SET|FILE",
        default=defaults.PROMPT_SET,
        help=f"Prompt set ({', '.join(PROMPT_SETS)}), a JSONL file (one "
        '{"prompt": ..., "max_tokens": ...} per line, or Spec-Bench\'s question.jsonl: first turns, every turn with '
        "bench --turns all) or a ShareGPT-style JSON file.",
    ),
    click.option("--max-tokens", type=int, default=None, help="Override every prompt's max_tokens."),
    click.option(
        "--category",
        "categories",
        multiple=True,
        metavar="NAME",
        help="Only the prompts of this category (repeatable): a shipped set's is its name, a Spec-Bench file's "
        "its rows' category.",
    ),
    click.option("--limit", type=int, default=None, help="Use only the first N prompts (after --category)."),
)
# check / bench served / tune: the server at --url
_protocol_option = click.option(
    "--protocol", type=click.Choice(defaults.PROTOCOLS), default=defaults.PROTOCOL, help="How to reach --url."
)
_wait_option = click.option("--wait", type=click.FloatRange(min=0), default=None, metavar="SECONDS", help=_wait_help)
_admin_key_option = click.option(  # the harness reads model configs, which `trt-spec serve` restricts
    "--admin-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="The admin key of the server at --url (the file `trt-spec serve --admin-key-file FILE` was given): "
    "`trt-spec serve` restricts model configs to it. Default: the key a `trt-spec serve` on this host left for "
    "--url's port.",
)


def _prompts(prompt_set: str, max_tokens: Optional[int], limit: Optional[int], categories: tuple[str, ...]):
    try:
        return select_prompts(load_prompts(prompt_set, max_tokens), categories)[:limit]
    except ValueError as e:
        raise UserError(str(e)) from None


def _progress(console, total: int, label: str):
    """(context, callback(done)): a rich bar on a terminal's stderr, else a plain line every PROGRESS_LINE_S."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    if console.is_terminal:
        prog = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            "ETA",
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
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


def _stage():
    """harness/phases.measure's stage callback: a progress display per measurement."""
    from rich.console import Console

    console = Console(stderr=True)
    return lambda label, total: _progress(console, total, label)


def _print_report(rep: dict, fmt: str, out_dir: Optional[str]) -> None:
    """A bench/tune report: its files under out_dir, then JSON or markdown."""
    if out_dir:
        from rich.console import Console

        console = Console(stderr=True)
        for f in write_reports(rep, Path(out_dir)):
            console.print(f"wrote {f}")
    if fmt == "json":
        click.echo(json.dumps(rep, indent=2, default=float))
    else:
        click.echo(markdown({**rep, "environment": environment()}))


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
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "sh"]),
    default="text",
    help="text for people, json for tools, sh for a runnable bash script.",
)
@click.option(
    "--alpha-from",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="REPORT.json",
    help="The text format's GPU prediction takes the acceptance this bench report measured (default: the mode's "
    "stated prior; docs/performance-model.md).",
)
def plan(
    config: str, gpu: Optional[str], sets: tuple[str, ...], allow_offload: bool, fmt: str, alpha_from: Optional[str]
) -> None:
    """Check CONFIG and print the build plan (runs nothing), and for a GPU config the predicted speedup at batch 1."""
    from .builder import perf_model

    measured = perf_model.read_alpha(Path(alpha_from)) if alpha_from else None
    # a plan builds nothing: a calibration that does not fit only warns
    p = _plan_for(config, sets, gpu, require_checkpoints=False, allow_offload=allow_offload or None)
    if fmt == "json":
        click.echo(json.dumps(p.to_json(), indent=2))
    elif fmt == "sh":
        click.echo(p.to_sh(), nl=False)
    else:
        click.echo(p.to_text())
        click.echo(perf_model.prediction_text(p.report, measured))


class _StepStatus:
    """A running step's display: a live status line on a terminal, else a periodic plain line."""

    def __init__(self, console):
        self.console = console
        self.status = console.status("") if console.is_terminal else None
        self.period = 0.5 if self.status is not None else defaults.PROGRESS_LINE_S * 3

    def start(self) -> None:
        if self.status is not None:
            self.status.start()

    def update(self, text: str) -> None:
        if self.status is not None:
            self.status.update(text)
        else:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def _build_events(console, log_dir: Path):
    """run_plan's on_event callback."""
    watch = StepWatch()

    def on_event(event: str, step, i: int, n: int) -> None:
        if event == "skip":
            console.print(f"[{i}/{n}] {step.name}: up to date, skipped", soft_wrap=True)
        elif event == "start":
            log = log_dir / f"{step.name}.log"
            console.print(f"[{i}/{n}] {step.name}: {step.description} (log: {log})", highlight=False, soft_wrap=True)
            watch.start(f"[{i}/{n}] {step.name}", log, _StepStatus(console))
        elif event in ("done", "fail"):
            secs = watch.stop()
            mark = "[green]done[/]" if event == "done" else "[red]FAILED[/]"
            console.print(f"[{i}/{n}] {step.name}: {mark} in {secs:.0f}s", highlight=False, soft_wrap=True)

    return on_event


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@_gpu_option
@_set_option
@_offload_option
@click.option("--dry-run", is_flag=True, help="Show which steps would run or are up to date; run nothing.")
@click.option("--force", is_flag=True, help="Rerun steps even when their outputs are up to date.")
@click.option("--only", metavar="STEP", default=None, help="Run a single step (its inputs must be built).")
def build(
    config: str,
    gpu: Optional[str],
    sets: tuple[str, ...],
    allow_offload: bool,
    dry_run: bool,
    force: bool,
    only: Optional[str],
) -> None:
    """Preflight CONFIG, then quantize/convert and build every engine (incremental, resumable)."""
    from rich.console import Console

    console = Console(stderr=True)
    p = _plan_for(config, sets, gpu, require_checkpoints=not dry_run, allow_offload=allow_offload)
    for w in p.report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for n in p.report.notes:
        console.print(f"note: {n}")
    if p.report.memory:
        console.print("memory plan per GPU:\n" + p.report.memory_table(), highlight=False)
    try:
        res = run_plan(
            p,
            config_path=Path(config),
            dry_run=dry_run,
            force=force,
            only=only,
            on_event=_build_events(console, Path(p.output_dir) / "logs"),
        )
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
    click.echo(
        f"build {p.name}: {ran} step(s) ran, {len(res.steps) - ran} up to date"
        + (f"; manifest: {res.manifest}" if res.manifest else "")
    )


@main.command()
@click.argument("source", type=click.Path(exists=True))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help=f"Repository directory (default: BUILD_DIR/{defaults.REPO_SUBDIR}).",
)
@click.option(
    "--decoupled/--no-decoupled",
    default=True,
    show_default=True,
    help="Decoupled engine models and BLS (streaming). --no-decoupled: NVIDIA's DTM recipe, for clients "
    "that call the models with unary infer (no streaming).",
)
@click.option(
    "--max-queue-size",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Requests an engine model queues for a batch slot before refusing new ones with the backend's "
    "'Maximum queue size' error (dynamic_batching.default_queue_policy). 0 = unbounded.",
)
@_gpu_option
@_set_option
def repo(
    source: str, out_dir: Optional[str], decoupled: bool, max_queue_size: int, gpu: Optional[str], sets: tuple[str, ...]
) -> None:
    """Write a Triton model repository from BUILD_DIR (its manifest.json) or from a CONFIG's plan."""
    from .repository.llmapi import missing_sources
    from .repository.writer import write_repository

    src = Path(source)
    manifest = manifest_from(src, sets, gpu)
    build_dir = src if src.is_dir() else manifest.config.resolved_output_dir(src)
    dest = Path(out_dir) if out_dir else build_dir / defaults.REPO_SUBDIR
    configs = write_repository(manifest, dest, decoupled=decoupled, max_queue_size=max_queue_size)
    click.echo(f"wrote {dest} ({', '.join(sorted(configs))})")
    for line in missing_sources(dest):  # runtime llmapi without NVIDIA's model source here
        click.echo(f"note: {line}")
    click.echo(f"serve it: trt-spec serve {dest}")
    plain = plain_launch(dest, manifest.engine)
    if plain:
        click.echo(f"or start tritonserver yourself, from any directory: {plain}")


_serve_options = _with(
    click.option("--http-port", default=defaults.HTTP_PORT, type=int, help="HTTP port."),
    click.option("--grpc-port", default=defaults.GRPC_PORT, type=int, help="gRPC port."),
    click.option("--metrics-port", default=defaults.METRICS_PORT, type=int, help="Metrics port."),
    click.option(
        "--host",
        default=defaults.HOST,
        help="Address to bind (0.0.0.0 for all interfaces: inference, metadata, statistics and metrics are "
        "then open to the network).",
    ),
    click.option(
        "--timeout",
        default=None,
        type=float,
        help=f"Seconds to wait for the server and every model to be ready  [default: "
        f"{defaults.READY_TIMEOUT_S:.0f} + {defaults.READY_S_PER_ENGINE_GIB:.0f} per GiB of engine files]",
    ),
    click.option(
        "--log",
        "log_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="tritonserver's log (kept after stop)  [default: REPOSITORY.tritonserver.HTTP_PORT.log]",
    ),
    click.option(
        "--admin-key-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Unlock the admin APIs (shared-memory, model-config, model-repository, trace, logging) for "
        "requests whose header triton-admin-key (gRPC: triton-grpc-protocol-triton-admin-key) holds the key "
        "in this file; a missing file is created with a random key, mode 0600. Without it the key is "
        "random. Either way it is left, 0600, in trt-spec's cache for the HTTP and gRPC ports while the "
        "server runs (check, bench and tune on this host find it there).",
    ),
    click.option(
        "--openai-port",
        type=click.IntRange(1, 65535),
        default=None,
        help="Also serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /metrics) on this "
        "port, in front of the server's gRPC port; models: ensemble (baseline), tensorrt_llm_bls "
        "(speculative); runtime llmapi: tensorrt_llm.",
    ),
    click.option(
        "--openai-api-key-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="The OpenAI API's key: its first line. Every /v1/* request then needs the header "
        "`Authorization: Bearer KEY` (else 401); /health, /metrics and /openapi.json stay open for probes and "
        f"Prometheus. Without it, the environment variable {defaults.OPENAI_API_KEY_ENV} (if set) is the key.",
    ),
    click.option(
        "--openai-allow-unauthenticated",
        is_flag=True,
        help="With no key and a --host other than loopback, bind the OpenAI port on --host anyway (without it, "
        "the OpenAI port stays on 127.0.0.1 and says so; Triton's own ports follow --host either way).",
    ),
    click.option(
        "--openai-max-concurrent",
        type=click.IntRange(1, None),
        default=defaults.OPENAI_MAX_CONCURRENT,
        show_default=True,
        help="OpenAI requests working in Triton at once; the rest wait in the queue.",
    ),
    click.option(
        "--openai-max-queued",
        type=click.IntRange(0, None),
        default=defaults.OPENAI_MAX_QUEUED,
        show_default=True,
        help="OpenAI requests waiting for a slot; beyond them, 429 with Retry-After.",
    ),
    click.option(
        "--openai-max-body-bytes",
        type=click.IntRange(1, None),
        default=defaults.OPENAI_MAX_BODY_BYTES,
        show_default=True,
        help="Largest OpenAI request body (413 beyond it); below the ~4 MiB body Triton 2.51's HTTP server crashes on.",
    ),
    click.option(
        "--drain-timeout",
        default=defaults.DRAIN_TIMEOUT_S,
        type=click.FloatRange(0, None),
        show_default=True,
        help="On SIGTERM/Ctrl-C: seconds the requests in flight get to finish (no new ones are admitted and "
        "/v2/health/ready turns false meanwhile); then those left end with a clear error.",
    ),
    click.option("--dry-run", is_flag=True, help="Print the exact command line(s) and exit."),
    click.option("--verbose", is_flag=True, help="tritonserver --log-verbose=1."),
)


@main.command()
@click.argument("repository", type=click.Path(file_okay=False))
@_serve_options
def serve(
    repository: str,
    log_path: Optional[str],
    admin_key_file: Optional[str],
    openai_api_key_file: Optional[str],
    dry_run: bool,
    **kw,
) -> None:
    """Start tritonserver on REPOSITORY (mpirun for TP/PP > 1) and keep it running until SIGTERM/Ctrl-C/SIGHUP.

    A signal drains: new requests are refused with a "shutting down" line and readiness turns false, the requests
    in flight finish (up to --drain-timeout, then they end with a clear error), then the server stops and the exit
    code is 0. A second signal stops at once. The server stops with this command, however it ends (kill -9
    included). If a model's python-backend process dies, the model can no longer answer: the server is stopped and
    the exit code is 3. Other exit codes: 1 the server failed or exited, 2 a bad argument or a busy port.
    """
    o = supervisor.ServeOptions(
        Path(repository),
        log_path=Path(log_path) if log_path else None,
        admin_key_file=Path(admin_key_file) if admin_key_file else None,
        openai_api_key_file=Path(openai_api_key_file) if openai_api_key_file else None,
        restart="trt-spec " + shlex.join(sys.argv[1:]),
        **kw,  # named as ServeOptions names them
    )
    if dry_run:
        for line in supervisor.dry_run(o):
            click.echo(line)
        return
    code = supervisor.run(o, out=click.echo, err=_err)
    sys.exit(code)


@main.command()
@click.option("--url", default=defaults.URL, metavar="HOST:PORT", help=_url_help)
@_protocol_option
@_prompt_options
@click.option("--num-draft-tokens", type=int, default=None, help="k per request (default: the deployment's).")
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False),
    default=None,
    help="Tokenizer dir: shows divergence context and enables the near-tie (top-2 logit margin) check.",
)
@click.option(
    "--margin",
    "--near-tie-margin",
    "margin",
    default=None,
    metavar="FILE|LOGITS",
    help="A divergence whose two tokens lie within this many logits of the baseline engine's best is a near-tie "
    "(reported apart, passes); anything else fails. FILE: a previous `check --format json` report's "
    f"measured_margin  [default: measured, {defaults.NOISE_FLOOR_SAFETY:g} x the noise floor probed on the baseline "
    f"engine; if nothing could be measured {defaults.NEAR_TIE_MARGIN} for a GPU engine, "
    f"{defaults.NEAR_TIE_MARGIN_EXACT} for the CPU stand-in]",
)
@click.option("--raw", is_flag=True, help="Send prompts as raw text (default with --tokenizer: its chat template).")
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    help="> 0: also a distribution-level (chi-square) check over seeded samples at this temperature.",
)
@click.option(
    "--samples",
    type=int,
    default=defaults.SAMPLING_SAMPLES,
    help="Seeded samples per prompt and model for the distribution check.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_wait_option
@_admin_key_option
def check(
    url: str,
    protocol: str,
    prompt_set: str,
    max_tokens: Optional[int],
    limit: Optional[int],
    categories: tuple[str, ...],
    num_draft_tokens: Optional[int],
    tokenizer: Optional[str],
    margin: Optional[str],
    raw: bool,
    temperature: float,
    samples: int,
    fmt: str,
    wait: Optional[float],
    admin_key_file: Optional[str],
) -> None:
    """Prove token-for-token identity of the speculative model against the baseline (exit 1 on a real mismatch,
    3 when divergences could not be probed and nothing failed)."""
    prompts = _prompts(prompt_set, max_tokens, limit, categories)
    if margin is not None:
        commands.parse_margin(margin)  # a bad --margin fails before the server is reached
    o = commands.CheckOptions(
        num_draft_tokens=num_draft_tokens,
        tokenizer=tokenizer,
        margin=margin,
        raw=raw,
        temperature=temperature,
        samples=samples,
    )
    client = commands.served_client(url, protocol, wait, admin_key_file, note=_note)
    rep = commands.run_check(client, prompts, o, stage=_stage(), note=_note)
    click.echo(json.dumps(rep.to_dict(), indent=2) if fmt == "json" else format_check(rep))
    sys.exit(rep.exit_code)


# bench's three modes share these options

_runs_options = _with(
    _prompt_options,
    click.option(
        "--k",
        "ks",
        multiple=True,
        type=int,
        help="Draft tokens per step (the cap under the adaptive policy); repeat to sweep (default: the "
        "deployment's num_draft_tokens).",
    ),
    click.option(
        "--repeats",
        type=int,
        default=1,
        help="Repetitions of the prompt set (the concurrency sweep sends prompts × repeats per level).",
    ),
    click.option(
        "--policy",
        "policies",
        multiple=True,
        type=click.Choice(POLICIES),
        help="Draft-length policy per request, adaptive or fixed; repeat to compare (default: the deployment's).",
    ),
    click.option(
        "--turns",
        type=click.Choice(TURNS),
        default=None,
        help="A multi-turn question's (Spec-Bench's MT-Bench rows, the agentic set) first turn only, or all: each "
        "turn one paired request, the conversation so far in the chat template with each model's own answers fed "
        "back, each conversation under one tenant of its own (default: all for the agentic set, else first).",
    ),
    click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text"),
)
_load_options = _with(  # bench served / bench openai: a server takes load
    click.option(
        "--concurrency",
        "levels",
        multiple=True,
        type=click.IntRange(min=1),
        help="Also sweep these numbers of requests in flight (repeatable), at the first --k and --policy.",
    ),
    click.option(
        "--request-rate",
        "rate",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        metavar="RPS",
        help="Also an open-loop run: requests at Poisson arrivals of RPS/s (seeded), to each model, with goodput.",
    ),
    click.option(
        "--num-requests",
        type=click.IntRange(min=1),
        default=None,
        help="Requests per model of the --request-rate run (default: prompts x repeats).",
    ),
    click.option(
        "--slo-ttft-ms",
        type=click.FloatRange(min=0),
        default=None,
        help="Goodput: a request meets the SLO only with TTFT at most this.",
    ),
    click.option("--slo-tpot-ms", type=click.FloatRange(min=0), default=None, help="Goodput: … and TPOT at most this."),
    click.option("--tokenizer", type=click.Path(file_okay=False), default=None, help=_tokenizer_help),
    click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help=_report_help),
)


_tenant_option = click.option(
    "--tenant",
    default=None,
    metavar="NAME",
    help="Send every speculative request as this tenant (the BLS's tenant input, OpenAI's user): the scope of the "
    "n-gram deployment's cross-request suffix cache, so --repeats measure it (docs/draft-policy.md).",
)


def _runs(ks, repeats, policies, turns: str = defaults.TURNS, profile: bool = False) -> commands.Runs:
    return commands.Runs(ks=tuple(ks), repeats=repeats, policies=tuple(policies), turns=turns, profile=profile)


_profile_option = click.option(
    "--profile",
    is_flag=True,
    help="Also show where the speculative requests' time went: proposal, target calls by tokens submitted, the "
    "BLS's Python and, served, Triton/gRPC (the BLS's return_profile input; docs/harness.md).",
)


_predict_option = click.option(
    "--predict",
    "predict",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="CONFIG",
    help="Also print the GPU performance model's prediction for CONFIG (a GPU build config) with the acceptance "
    "this run measured (docs/performance-model.md).",
)


def _print_prediction(plan, rep: dict, fmt: str) -> None:
    """bench --predict; on stderr with --format json, so stdout stays one JSON document."""
    from .builder import perf_model

    k = plan.report.num_draft_tokens
    try:
        text = perf_model.prediction_text(plan.report, perf_model.alpha_from_report(rep, "this bench run", k))
    except perf_model.PerfModelError as e:
        text = f"prediction: n/a ({e})"
    click.echo(text, err=fmt == "json")


def _bench_remote(target, runs, load: dict, fmt: str, out_dir: Optional[str], predict: Optional[str] = None) -> None:
    """bench served / openai: run `target` (a harness.commands function) and print the report."""
    plan = _plan_for(predict, (), None, require_checkpoints=False, allow_offload=None) if predict else None
    commands.check_turns(runs, commands.Load(**load))  # before the server is reached
    rep = commands.bench_remote(target(), runs, commands.Load(**load), stage=_stage(), note=_note)
    _print_report(rep, fmt, out_dir)
    if plan is not None:
        _print_prediction(plan, rep, fmt)


@main.group()
def bench() -> None:
    """Benchmark the speculative model against the baseline, paired (same prompts, alternating): speedup with a 95%
    interval, acceptance, TTFT/TPOT. Choose where the two models run:"""


@bench.command("served", short_help="A Triton deployment at --url HOST:PORT (trt-spec serve).")
@click.option("--url", required=True, metavar="HOST:PORT", help=_url_help)
@_protocol_option
@_wait_option
@_admin_key_option
@_runs_options
@_load_options
@_predict_option
@_tenant_option
@_profile_option
def bench_served(
    url: str,
    protocol: str,
    wait: Optional[float],
    admin_key_file: Optional[str],
    prompt_set: str,
    max_tokens: Optional[int],
    limit: Optional[int],
    categories: tuple[str, ...],
    ks: tuple[int, ...],
    repeats: int,
    policies: tuple[str, ...],
    turns: str,
    fmt: str,
    tokenizer: Optional[str],
    out_dir: Optional[str],
    predict: Optional[str],
    tenant: Optional[str],
    profile: bool,
    **load,
) -> None:
    """Against a deployment served by Triton (trt-spec serve) at --url: speedup with a 95% interval, acceptance,
    TTFT/TPOT, optionally a concurrency sweep, a request-rate run with goodput, and report files."""
    prompts = _prompts(prompt_set, max_tokens, limit, categories)
    turns = turns or default_turns(prompt_set)
    _bench_remote(
        lambda: commands.served_target(url, protocol, wait, admin_key_file, tokenizer, prompts, _note, turns, tenant),
        _runs(ks, repeats, policies, turns, profile),
        load,
        fmt,
        out_dir,
        predict,
    )


@bench.command("openai", short_help="Any OpenAI-compatible server(s) at --url (vLLM, SGLang, ...).")
@click.option(
    "--url",
    "urls",
    required=True,
    multiple=True,
    metavar="URL",
    help="http://HOST:PORT[/v1]; once (both models on it) or twice (the baseline's server, then the "
    "speculative one's).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Twice: the baseline's model name, then the speculative one's "
    "(default: trt-spec's, ensemble and tensorrt_llm_bls).",
)
@click.option(
    "--api",
    type=click.Choice(["chat", "completions"]),
    default="chat",
    help="/v1/chat/completions (the server applies the chat template) or /v1/completions (raw prompts).",
)
@click.option(
    "--api-key",
    default="none",
    envvar="OPENAI_API_KEY",
    show_envvar=True,
    help="Bearer token, if the server wants one.",
)
@_runs_options
@_load_options
@_predict_option
@_tenant_option
def bench_openai(
    urls: tuple[str, ...],
    models: tuple[str, ...],
    api: str,
    api_key: str,
    prompt_set: str,
    max_tokens: Optional[int],
    limit: Optional[int],
    categories: tuple[str, ...],
    ks: tuple[int, ...],
    repeats: int,
    policies: tuple[str, ...],
    turns: str,
    fmt: str,
    tokenizer: Optional[str],
    out_dir: Optional[str],
    predict: Optional[str],
    tenant: Optional[str],
    **load,
) -> None:
    """Against any OpenAI-compatible server(s): trt-spec serve --openai-port, vLLM, SGLang, trtllm-serve,
    llama-server; the same runs and report as `bench served`."""
    prompts = _prompts(prompt_set, max_tokens, limit, categories)
    turns = turns or default_turns(prompt_set)
    _bench_remote(
        lambda: commands.openai_target(urls, models, api, api_key, tokenizer, prompts, _note, turns, tenant),
        _runs(ks, repeats, policies, turns),
        load,
        fmt,
        out_dir,
        predict,
    )


@bench.command("in-process", short_help="CONFIG's built reference engine, in this process, no server.")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--ignore-eos", is_flag=True, help="Generate exactly max_tokens (fixed-length benchmark).")
@click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice).")
@click.option("--compare-hf", is_flag=True, help="Also time target-only greedy against HF generate.")
@_set_option
@_runs_options
@_predict_option
@_profile_option
def bench_in_process(
    config: str,
    ignore_eos: bool,
    threads: Optional[int],
    compare_hf: bool,
    sets: tuple[str, ...],
    prompt_set: str,
    max_tokens: Optional[int],
    limit: Optional[int],
    categories: tuple[str, ...],
    ks: tuple[int, ...],
    repeats: int,
    policies: tuple[str, ...],
    turns: str,
    fmt: str,
    predict: Optional[str],
    profile: bool,
) -> None:
    """The same speculative loop and policy over CONFIG's reference engines (built with `trt-spec build CONFIG`) in
    this process, no server: speedup, decode speedup, token identity, acceptance, the policy's per-round k counts,
    the draft/target cost ratio and the Leviathan bound."""
    from .harness.inprocess import format_report, to_json

    plan = _plan_for(predict, (), None, require_checkpoints=False, allow_offload=None) if predict else None
    prompts = _prompts(prompt_set, max_tokens, limit, categories)
    turns = turns or default_turns(prompt_set)
    try:
        rep = commands.bench_in_process(
            Path(config),
            sets,
            prompts,
            _runs(ks, repeats, policies, turns, profile),
            ignore_eos=ignore_eos,
            threads=threads,
            compare_hf=compare_hf,
            progress=lambda s: _err(s) if fmt == "text" else None,
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    click.echo(to_json(rep) if fmt == "json" else format_report(rep))
    if plan is not None:
        _print_prediction(plan, rep, fmt)


@main.command()
@click.option("--url", default=defaults.URL, metavar="HOST:PORT", help=_url_help)
@_protocol_option
@_prompt_options
@click.option(
    "--k",
    "ks",
    multiple=True,
    type=int,
    default=defaults.TUNE_KS,
    help="Fixed k values to try (repeatable); the adaptive policy then runs capped at the largest.",
)
@click.option("--repeats", type=int, default=1, help="Repetitions of the prompt set per k.")
@click.option("--tokenizer", type=click.Path(file_okay=False), default=None, help=_tokenizer_help)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help=_report_help)
@_wait_option
@_admin_key_option
def tune(
    url: str,
    protocol: str,
    prompt_set: str,
    max_tokens: Optional[int],
    limit: Optional[int],
    categories: tuple[str, ...],
    ks: tuple[int, ...],
    repeats: int,
    tokenizer: Optional[str],
    out_dir: Optional[str],
    wait: Optional[float],
    admin_key_file: Optional[str],
) -> None:
    """Sweep fixed num_draft_tokens (k), then the adaptive policy, against a served deployment; recommend a k and
    report adaptive against the best fixed k (speedups with 95% intervals, one run)."""
    prompts = _prompts(prompt_set, max_tokens, limit, categories)
    client = commands.served_client(url, protocol, wait, admin_key_file, note=_note)
    prompts = commands.chat_prompts(prompts, tokenizer, _note)
    prog, cb = _stage()("k sweep (fixed, then adaptive)", len(ks) + 1)
    with prog:
        res = tune_k(client, prompts, list(ks), repeats=repeats, progress=cb, note=_note)
    rep = {"title": f"tune {url}", "tune": res}
    if out_dir:
        write_reports(rep, Path(out_dir))
    _print_report(rep, "text", None)


@main.command(
    help=f"End to end on this machine: build CONFIG (default: {defaults.DEMO_CONFIG}), repo, serve, "
    "check and bench over HTTP and gRPC, a concurrency sweep over gRPC, reports, stop."
)
@click.argument("config", type=click.Path(dir_okay=False), default=defaults.DEMO_CONFIG)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=defaults.DEMO_OUT,
    help="Where the repository, server log and reports go.",
)
def demo(config: str, out_dir: str) -> None:
    from .demo import format_verdict, run_demo

    _sigterm_as_ctrl_c()
    try:
        rep = run_demo(Path(config), Path(out_dir), say=_err)
    except KeyboardInterrupt:
        _err("interrupted: the server was stopped")
        sys.exit(130)
    except ConfigError:
        raise
    except TrtSpecError as e:  # the demo failed past its config: exit 1, as a failed check
        _err(f"error: {e}")
        sys.exit(1)
    click.echo(format_verdict(rep))
    sys.exit(0 if rep["passed"] else 1)


@main.group()
def deploy() -> None:
    """Deployment bundles for the GPU deployment a build (or a config's plan) describes."""


@deploy.command("k8s")
@click.argument("source", type=click.Path())
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Chart directory to write (Chart.yaml, values.yaml, templates/, prometheus-adapter-values.yaml).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs per node of the cluster; a plan needing more is refused (one node per replica; deploy dynamo or "
    "trtllm-serve run runtime: llmapi across nodes)  "
    f"[default: the plan's GPU count, at most {defaults.GPUS_PER_NODE}]",
)
@click.option(
    "--min-acceptance",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Alert threshold on accepted/drafted draft tokens  [default: break-even c + (r-1)/k, r = "
    f"{defaults.VERIFY_COST_GPU}]",
)
@_gpu_option
@_set_option
def k8s(
    source: str,
    out_dir: str,
    gpus_per_node: Optional[int],
    min_acceptance: Optional[float],
    gpu: Optional[str],
    sets: tuple[str, ...],
) -> None:
    """Write a Helm chart for BUILD_DIR (its manifest.json) or CONFIG (its plan): pinned NGC image, build Job into a
    PersistentVolumeClaim, Deployment (or LeaderWorkerSet), Service, PodMonitor, HPA, PodDisruptionBudget and an
    acceptance alert."""
    out = write_chart(
        Path(source), Path(out_dir), gpus_per_node=gpus_per_node, min_acceptance=min_acceptance, sets=sets, gpu=gpu
    )
    click.echo(f"wrote {out} (Helm chart) and {out / ADAPTER_VALUES}")
    click.echo(f"install: helm install NAME {out}   (render first: helm template NAME {out})")


@deploy.command("trtllm-serve")
@click.argument("source", type=click.Path())
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write (extra_llm_api_options.yaml, launch.sh, README.md).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs per node; a plan needing more runs under srun or mpirun with trtllm-llmapi-launch  "
    f"[default: the plan's GPU count, at most {defaults.GPUS_PER_NODE}]",
)
@click.option("--port", type=click.IntRange(1, 65535), default=lc.TRTLLM_SERVE_PORT, show_default=True)
@_gpu_option
@_set_option
def deploy_trtllm_serve(
    source: str, out_dir: str, gpus_per_node: Optional[int], port: int, gpu: Optional[str], sets: tuple[str, ...]
) -> None:
    """Write TensorRT-LLM's own OpenAI server launch for a `runtime: llmapi` BUILD_DIR or CONFIG: the LLM's
    arguments (model.yaml's), launch.sh and a README."""
    from .deploy.trtllm_serve import LAUNCH_FILE, write_bundle

    out = write_bundle(Path(source), Path(out_dir), gpus_per_node=gpus_per_node, port=port, sets=sets, gpu=gpu)
    click.echo(f"wrote {out} (trtllm-serve launch); run: bash {out / LAUNCH_FILE}   (see {out / 'README.md'})")


@deploy.command("dynamo")
@click.argument("source", type=click.Path())
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write (extra-engine-args.yaml, launch.sh, dynamo-graph-deployment.yaml, README.md).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs per node; a plan needing more is a multi-node worker (DGD multinode.nodeCount, srun)  "
    f"[default: the plan's GPU count, at most {defaults.GPUS_PER_NODE}]",
)
@click.option(
    "--port", type=click.IntRange(1, 65535), default=DYNAMO_PORT, show_default=True, help="The frontend's port."
)
@_gpu_option
@_set_option
def deploy_dynamo(
    source: str, out_dir: str, gpus_per_node: Optional[int], port: int, gpu: Optional[str], sets: tuple[str, ...]
) -> None:
    """Write NVIDIA Dynamo's TensorRT-LLM deployment for a `runtime: llmapi` BUILD_DIR or CONFIG: the worker's
    --extra-engine-args (model.yaml's LLM arguments), launch.sh (frontend + worker), a DynamoGraphDeployment and a
    README."""
    from .deploy.dynamo import DGD_FILE, LAUNCH_FILE, write_bundle

    out = write_bundle(Path(source), Path(out_dir), gpus_per_node=gpus_per_node, port=port, sets=sets, gpu=gpu)
    dgd = f"; Kubernetes: kubectl apply -f {out / DGD_FILE}" if (out / DGD_FILE).is_file() else ""
    click.echo(f"wrote {out} (Dynamo); run: bash {out / LAUNCH_FILE}{dgd}   (see {out / 'README.md'})")


@main.command()
def doctor() -> None:
    """Show what this machine has (GPU, TensorRT-LLM, tritonserver, ...) and what each gap blocks."""
    checks = run_checks(say=_err)
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


@main.command(
    help="GPU host: every link in minutes (doctor; build, repo, the plain launch from another directory, serve, "
    "NVIDIA's clients, check and bench on SmolLM2-135M for runtime engine and its llmapi twin; then the kernel twin, "
    "a random-weight Llama in the 70B's attention and vocabulary shape, and on 2+ GPUs its TP2 orchestrator chain); "
    "writes OUT/report.md and report.json: every link ok, or the first failure of each chain with the log lines that "
    "matter, plus check's measured margin and quantize.py's measured peak. `make gpu-smoke`."
)
@click.option(
    "--gpu",
    default="auto",
    show_default=True,
    metavar="NAME[:COUNT]",
    help="The GPU to plan for (auto: nvidia-smi), e.g. h100:1.",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="build/gpu-smoke", show_default=True)
@click.option(
    "--calib-dataset",
    type=click.Path(file_okay=False),
    default=None,
    help="Local calibration set for quantize.py (default: the one trt-spec ships).",
)
@click.option(
    "--engine-config",
    type=click.Path(dir_okay=False),
    default="build_configs/smollm2-first-contact-fp8.yaml",
    show_default=True,
)
@click.option(
    "--llmapi-config",
    type=click.Path(dir_okay=False),
    default="build_configs/smollm2-first-contact-llmapi.yaml",
    show_default=True,
)
def smoke(gpu: str, out_dir: str, calib_dataset: Optional[str], engine_config: str, llmapi_config: str) -> None:
    _sigterm_as_ctrl_c()
    rep = run_smoke(
        SmokeSettings(
            engine_config=engine_config,
            llmapi_config=llmapi_config,
            out_dir=out_dir,
            gpu=gpu,
            calib_dataset=calib_dataset,
        ),
        say=_err,
    )
    for chain in rep.chains:
        click.echo(f"{chain}: {rep.chain_verdict(chain)}")
    click.echo(f"report: {Path(out_dir) / 'report.md'}")
    sys.exit(0 if rep.ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
