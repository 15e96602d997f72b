"""Runner: executes a Plan incrementally, atomically and resumably, then writes manifest.json.

Steps write to a temporary directory renamed on success, under a per-output-dir lock; a stamp (fingerprint, file
sizes and sha256) skips up-to-date steps. A step's tool dies with the build, even on kill -9 (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .. import __version__
from ..errors import TrtSpecError
from ..records.integrity import IntegrityError, file_sums, verify
from ..records.manifest import (
    BuildManifest,
    CalibrationRecord,
    EngineEntry,
    GpuRecord,
    StepRecord,
)
from ..records.procutil import die_with_parent, stop_group
from .calibration import fingerprint as calibration_fingerprint
from .plan import STEP_STAMP, Plan, Step
from .trtllm import dist_version, trtllm_mismatch

LOG_TAIL_LINES = 25

log = logging.getLogger(__name__)


class BuildError(TrtSpecError, RuntimeError):
    def __init__(
        self, message: str, step: Optional[str] = None, log: Optional[Path] = None, tail: str = "", rerun: str = ""
    ):
        super().__init__(message)
        self.step, self.log, self.tail, self.rerun = step, log, tail, rerun


class BuildLockedError(BuildError):
    pass


@dataclass
class StepResult:
    name: str
    status: str  # ran | skipped | would-run | up-to-date
    seconds: float = 0.0


@dataclass
class BuildResult:
    output_dir: Path
    steps: list[StepResult] = field(default_factory=list)
    manifest: Optional[Path] = None


Event = Callable[[str, Step, int, int], None]  # (event, step, index, total); event in start|skip|done|fail


def read_stamp(output: Path) -> Optional[dict]:
    f = output / STEP_STAMP
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_up_to_date(step: Step) -> bool:
    """The stamp has the step's fingerprint and every recorded file still matches; a changed file is logged."""
    out = Path(step.output)
    stamp = read_stamp(out)
    if not stamp or stamp.get("fingerprint") != step.fingerprint:
        return False
    try:  # older stamps carry no "files"
        verify(out, stamp.get("files") or {}, "rerunning the step", kind=f"step {step.name}: output file")
    except IntegrityError as e:
        log.warning("%s", e)
        return False
    return True


class _Lock:
    def __init__(self, out: Path):
        self.path = out / ".lock"
        self.fd: Optional[int] = None

    def __enter__(self) -> "_Lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise BuildLockedError(
                f"another trt-spec build of {self.path.parent} is running (pid {holder}); wait for it to finish "
                "(the lock is released automatically when that process exits)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def _clean_stale(step: Step) -> None:
    out = Path(step.output)
    if not out.parent.is_dir():
        return
    for p in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in out.parent.glob(f".{out.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class _TerminateAsInterrupt:
    """SIGTERM and SIGHUP unwind like Ctrl-C while a tool runs (main thread only; elsewhere a no-op)."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self) -> None:
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.saved[sig] = signal.signal(sig, self._raise)

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _run_step(step: Step, log_path: Path, rerun: str) -> float:
    out = Path(step.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [str(tmp) if a == step.output else a for a in step.argv]
    env = {**os.environ, **step.env}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "w") as logf, _TerminateAsInterrupt():
        logf.write(f"$ {shlex.join(argv)}\n")
        logf.flush()
        try:  # own session (Ctrl-C is handled below), but dies with this thread (PDEATHSIG)
            proc = subprocess.Popen(
                argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(
                f"step {step.name}: cannot start {argv[0]}: {e.strerror}; install it or fix "
                "toolchain.* in the config (trt-spec doctor shows what is missing)",
                step.name,
                log_path,
                "",
                rerun,
            ) from None
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C / SIGTERM / SIGHUP: stop the tool's process group
            stop_group(proc, grace_s=10)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    seconds = time.monotonic() - t0
    if rc != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(
            f"step {step.name} failed (exit code {rc}) after {seconds:.1f}s; log: {log_path}",
            step.name,
            log_path,
            _tail(log_path),
            rerun,
        )
    if not tmp.is_dir():
        raise BuildError(
            f"step {step.name} exited 0 but wrote nothing to its output directory; log: {log_path}",
            step.name,
            log_path,
            _tail(log_path),
            rerun,
        )
    stamp = {
        "step": step.name,
        "fingerprint": step.fingerprint,
        "argv": list(step.argv),
        "seconds": round(seconds, 3),
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "files": file_sums(tmp, skip={STEP_STAMP}),
    }
    (tmp / STEP_STAMP).write_text(json.dumps(stamp, indent=2))
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return seconds


def tool_versions(plan: Plan) -> dict[str, Optional[str]]:
    """Versions without importing heavy packages (tensorrt_llm is never imported here)."""
    out = {"trt_spec": __version__, "tensorrt_llm": dist_version("tensorrt_llm"), "torch": dist_version("torch")}
    if plan.engine == "tensorrt":
        out["trtllm_build"] = shutil.which(plan.report.config.toolchain.trtllm_build)
    return out


def build_manifest(plan: Plan, config_path: Optional[Path], results: list[StepResult]) -> BuildManifest:
    cfg = plan.report.config
    r = plan.report
    engines = {role: _engine_entry(plan, role, edir) for role, edir in plan.engines.items()}
    g = plan.gpu
    return BuildManifest(
        name=plan.name,
        config_path=str(config_path) if config_path else None,
        config_hash=plan.config_hash,
        config=cfg,
        engine=plan.engine,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        tool_versions=tool_versions(plan),
        gpu=None if g is None else GpuRecord(g.name, list(g.compute_capability), g.memory_gib, g.count, g.source),
        deployment=r.deployment(_tokenizer_dir(plan, engines)),
        engines=engines,
        steps=[StepRecord(s.name, s.status, round(s.seconds, 3)) for s in results],
        calibration=None
        if r.calibration is None
        else CalibrationRecord(
            r.calibration.dataset,
            r.calibration.path,
            calibration_fingerprint(r.calibration.path),
            r.calibration.samples,
            r.calibration.calib_size,
            r.calibration.max_seq_length,
        ),
    )


def _tokenizer_dir(plan: Plan, engines: dict[str, EngineEntry]) -> str:
    """The tokenizer the repository serves with: the target's HF checkpoint on GPUs, else the exported engine."""
    cfg, target = plan.report.config, engines["target"]
    tok = (target.checkpoint or cfg.target.checkpoint) if cfg.recipe.gpu else target.dir
    return tok if tok.startswith("pkg:") else os.path.abspath(tok)


def _engine_entry(plan: Plan, role: str, edir: str) -> EngineEntry:
    """One role's engine as the manifest records it (llmapi on GPUs: the checkpoint it serves)."""
    cfg = plan.report.config
    r = plan.report
    model = cfg.draft if role == "draft" else cfg.target  # the baseline is the target, built plain
    if cfg.runtime == "llmapi" and plan.engine == "tensorrt":  # a checkpoint served as it is: no build sums
        spec = model or cfg.target  # the EAGLE-3 head: the target's parallelism
        return EngineEntry(
            dir=str(Path(edir).resolve()),
            checkpoint=edir,
            tp=spec.tp,
            pp=spec.pp,
            world_size=spec.world_size,
            devices=list(r.draft_devices if role == "draft" else r.target_devices),
            weights=r.quant.weights,
            kv_cache=r.quant.kv_cache,
            argv=[],
            fingerprint="",
            max_draft_len=r.max_draft_len if role == "target" else 0,
            gather_generation_logits=False,
            step="",
            files=None,
        )
    step = plan.step(f"engine-{role}" if plan.engine == "tensorrt" else f"export-{role}")
    stamp = read_stamp(Path(step.output)) or {}
    built = stamp.get("fingerprint") == step.fingerprint
    return EngineEntry(
        dir=str(Path(edir).resolve()),
        checkpoint=str(Path(plan.sources[role]).resolve()) if role in plan.sources else model.checkpoint,
        tp=model.tp,
        pp=model.pp,
        world_size=model.world_size,
        devices=list(r.draft_devices if role == "draft" else r.target_devices),
        weights=r.quant.weights,
        kv_cache=r.quant.kv_cache,
        argv=list(step.argv),
        fingerprint=step.fingerprint,
        max_draft_len=r.max_draft_len if role == "target" else 0,
        gather_generation_logits="--gather_generation_logits" in step.argv,
        step=step.name,
        files=stamp.get("files") if built else None,
    )


def run_plan(
    plan: Plan,
    *,
    config_path: Optional[Path] = None,
    dry_run: bool = False,
    force: bool = False,
    only: Optional[str] = None,
    on_event: Optional[Event] = None,
) -> BuildResult:
    out = Path(plan.output_dir)
    names = [s.name for s in plan.steps]
    if only is not None and only not in names:
        raise BuildError(f"--only {only}: no such step; steps are {', '.join(names)}")
    emit = on_event or (lambda *a: None)
    cfg_arg = shlex.quote(str(config_path)) if config_path else "CONFIG"
    result = BuildResult(out)
    checked: dict[str, bool] = {}  # step -> up to date: each output is hashed at most once per run

    def up_to_date(s: Step) -> bool:
        if s.name not in checked:
            checked[s.name] = is_up_to_date(s)
        return checked[s.name]

    if dry_run:
        for i, s in enumerate(plan.steps, 1):
            if only is None or s.name == only:
                st = "up-to-date" if (not force and up_to_date(s)) else "would-run"
                result.steps.append(StepResult(s.name, st))
        return result

    if plan.engine == "tensorrt" and (mismatch := trtllm_mismatch()) is not None:
        raise BuildError(mismatch)  # before any step: engines built by another TensorRT-LLM do not load
    with _Lock(out):
        for i, step in enumerate(plan.steps, 1):
            _clean_stale(step)
            if only is not None and step.name != only:
                continue
            if only is not None:
                for dep in step.inputs:
                    producer = next((s for s in plan.steps if s.output == dep), None)
                    if producer is not None and not up_to_date(producer):
                        raise BuildError(
                            f"--only {only} needs the output of {producer.name}, which is missing or "
                            f"stale; run `trt-spec build {cfg_arg}` first"
                        )
            if not force and up_to_date(step):
                emit("skip", step, i, len(plan.steps))
                result.steps.append(StepResult(step.name, "skipped"))
                continue
            emit("start", step, i, len(plan.steps))
            rerun = f"trt-spec build {cfg_arg} --only {step.name}"
            try:
                secs = _run_step(step, out / "logs" / f"{step.name}.log", rerun)
            except BuildError:
                emit("fail", step, i, len(plan.steps))
                raise
            checked[step.name] = True  # its sums were just recorded
            emit("done", step, i, len(plan.steps))
            result.steps.append(StepResult(step.name, "ran", secs))
        if all(up_to_date(s) for s in plan.steps):
            result.manifest = build_manifest(plan, config_path, result.steps).write(out)
    return result
