"""Wiring of the stages for callers that go from a config file straight to a later stage (no build run):
config -> preflight -> plan -> the manifest the runner would write. The stages themselves stay independent:
the runner executes a plan it is given, and the repository writer takes a manifest without knowing how to plan."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from .config import load_config
from .hardware import resolve_gpu
from .manifest import BuildManifest
from .plan import make_plan
from .preflight import run_preflight
from .runner import build_manifest


def manifest_for_config(config_path: Path, sets: Iterable[str] = (), gpu: Optional[str] = None) -> BuildManifest:
    """The manifest of a config's plan, engines not built yet (files None): the repository can be written before
    the build runs. Raises ConfigError, PreflightError or HardwareError (one line each)."""
    cfg = load_config(config_path, tuple(sets))
    gpu_spec = resolve_gpu(cfg.gpu, gpu) if cfg.engine == "tensorrt" else None
    plan = make_plan(cfg, run_preflight(cfg, gpu_spec, require_checkpoints=False), Path(config_path))
    return build_manifest(plan, Path(config_path), [])
