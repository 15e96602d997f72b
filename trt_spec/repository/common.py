"""What every runtime's repository writer shares: where the shipped python models are, the one error, reading a
config.pbtxt back, the memory check, and the atomic write of a planned repository.

One writer per runtime (records/recipes.py Recipe.writer): writer.py for runtime engine (the tensorrt_llm models, the
ensemble and the speculative BLS), llmapi.py for runtime llmapi (TensorRT-LLM's LLM-API model). Each plans its
repository as a RepoPlan (the models' configs, the record, how to write the files); writer.write_repository picks the
runtime's plan and writes it here, the same way for both: memory checked before anything is written, files into a
temporary directory, validated, renamed into place.
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
    """The python-backend models (NAME/1/model.py): top-level model_repo/ in a checkout, `trt_spec.model_repo` in an
    installed wheel (pyproject.toml maps one to the other). Data: never imported by trt_spec (they import
    triton_python_backend_utils, which exists only inside a Triton stub), copied into each repository."""
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
    """The repository's memory plan (repository/memory.py): RepositoryError, one line, when the models Triton holds at
    once overflow a GPU; before anything is written."""
    line = overflow(manifest, configs, yamls, record)
    if line is not None:
        raise RepositoryError(line)


@dataclass(frozen=True)
class RepoPlan:
    """One runtime's repository before it is written."""

    configs: dict[str, mc.ModelConfig]  # name -> config.pbtxt
    record: RepoRecord  # trt_spec_repo.json
    write: Callable[[Path], None]  # writes every model's files under a (temporary) repository directory
    yamls: dict[str, dict] = field(default_factory=dict)  # name -> 1/model.yaml (LLM-API models)
    require_sources: bool = True  # validate: every python model has its model.py (LLM-API: NVIDIA's may be absent)


def write_planned(
    manifest: BuildManifest, plan: RepoPlan, dest: Path, validate: Callable[..., dict[str, mc.ModelConfig]]
) -> dict[str, mc.ModelConfig]:
    """Check the plan's memory, then write it atomically (temp dir, validate, rename). Safe to rerun over an
    existing repository."""
    check_memory(manifest, plan.configs, plan.yamls, plan.record)
    with replacing_dir(Path(dest)) as tmp:
        tmp.mkdir()
        plan.write(tmp)
        plan.record.write(tmp)
        validate(tmp, require_sources=plan.require_sources)
    return plan.configs
