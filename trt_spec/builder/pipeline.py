"""Wiring of the stages for callers that go from a config file straight to a later stage (no build run):
config -> preflight -> plan -> the manifest the runner would write. The stages themselves stay independent:
the runner executes a plan it is given, and the repository writer takes a manifest without knowing how to plan."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from ..records.config import BuildConfig, load_config
from ..records.manifest import BuildManifest
from .hardware import detect_gpus, resolve_gpu
from .plan import Plan, make_plan
from .preflight import run_preflight
from .runner import build_manifest


def plan_for(
    cfg: BuildConfig,
    config_path: Path,
    gpu: Optional[str] = None,
    *,
    require_checkpoints: bool = True,
    allow_offload: Optional[bool] = None,
) -> Plan:
    """config -> preflight -> plan. The GPU (for engine: tensorrt) is `gpu` (NAME[:COUNT]) if given, else the
    config's. A build (require_checkpoints) checks that calibration fits the GPUs of this host (quantize.py sees them
    all; a build node may have more than the serving plan), a plan those it plans for; allow_offload: False refuses a
    calibration that does not fit, True lets it offload, None (builds nothing) warns (run_preflight). Raises
    PreflightError or HardwareError (one line each)."""
    gpu_spec = resolve_gpu(cfg.gpu, gpu) if cfg.recipe.gpu else None
    host = detect_gpus() if require_checkpoints and cfg.recipe.gpu else None
    report = run_preflight(
        cfg, gpu_spec, require_checkpoints=require_checkpoints, allow_offload=allow_offload, calibration_gpu=host
    )
    return make_plan(cfg, report, Path(config_path))


def manifest_for_config(config_path: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """The manifest of a config's plan, engines not built yet (files None): the repository can be written before
    the build runs. Raises ConfigError, PreflightError or HardwareError (one line each)."""
    plan = plan_for(load_config(config_path, tuple(sets)), Path(config_path), gpu, require_checkpoints=False)
    return build_manifest(plan, Path(config_path), [])


def manifest_from(source: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """BUILD_DIR (its manifest.json, as the build wrote it) or CONFIG (its plan, before the build)."""
    source = Path(source)
    if source.is_dir():
        return BuildManifest.read(source)
    return manifest_for_config(source, sets, gpu)
