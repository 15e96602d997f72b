"""What the repository writers share (writer.py: runtime engine, llmapi.py: runtime llmapi): the shipped python
models, the error, config.pbtxt parsing, and the atomic write of a RepoPlan (memory checked first, then a temporary
directory, validated, renamed into place).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import TrtSpecError
from ..records.atomic import replacing_dir
from ..records.manifest import BuildManifest, RepoRecord
from .memory import overflow


def model_repo_sources() -> Path:
    """The python-backend models (NAME/1/model.py), copied into each repository; never imported here (they need
    Triton's triton_python_backend_utils)."""
    from importlib.resources import files

    return Path(str(files("trt_spec.model_repo")))


class RepositoryError(TrtSpecError, ValueError):
    """A broken model repository (one line naming the model, the problem and the fix)."""


TEMPLATE_VAR = re.compile(r"\$\{[^}]*\}")


def parse_config(path: Path) -> mc.ModelConfig:
    text = path.read_text()
    leftover = TEMPLATE_VAR.search(text)
    if leftover:
        raise RepositoryError(
            f"{path}: unfilled template variable {leftover.group(0)}; set it or regenerate with trt-spec repo"
        )
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        raise RepositoryError(f"{path}: not a valid Triton ModelConfig ({e}); regenerate with trt-spec repo") from None


def write_config(model_dir: Path, cfg: mc.ModelConfig) -> None:
    """NAME/config.pbtxt and the NAME/1 version directory."""
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(cfg))


def check_memory(
    manifest: BuildManifest, configs: dict[str, mc.ModelConfig], yamls: dict[str, dict], record: RepoRecord
) -> None:
    """RepositoryError when the models Triton holds at once overflow a GPU."""
    line = overflow(manifest, configs, yamls, record)
    if line is not None:
        raise RepositoryError(line)


@dataclass(frozen=True)
class RepoPlan:
    """One runtime's repository before it is written."""

    configs: dict[str, mc.ModelConfig]
    record: RepoRecord
    write: Callable[[Path], None]  # writes every model's files under the given repository directory
    yamls: dict[str, dict] = field(default_factory=dict)  # name -> 1/model.yaml (LLM-API models)
    require_sources: bool = True  # False: NVIDIA's LLM-API model.py may be absent


def write_planned(
    manifest: BuildManifest, plan: RepoPlan, dest: Path, validate: Callable[..., dict[str, mc.ModelConfig]]
) -> dict[str, mc.ModelConfig]:
    """Check the plan's memory, then write it atomically; safe to rerun over an existing repository."""
    check_memory(manifest, plan.configs, plan.yamls, plan.record)
    with replacing_dir(Path(dest)) as tmp:
        tmp.mkdir()
        plan.write(tmp)
        plan.record.write(tmp)
        validate(tmp, require_sources=plan.require_sources)
    return plan.configs
