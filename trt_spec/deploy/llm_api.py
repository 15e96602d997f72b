"""The LLM API's arguments outside Triton, for trtllm-serve's --extra_llm_api_options and Dynamo's
--extra-engine-args: model.yaml's LLM keyword arguments less `triton_config` and the checkpoint (`model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from ..errors import TrtSpecError
from ..records import llmapi_contract as lc
from ..records.manifest import BuildManifest, ManifestError

ON_COMMAND_LINE = ("model",)  # both launchers take the checkpoint as an argument


class LlmApiArgsError(TrtSpecError, ValueError):
    """The build cannot be served by the LLM API outside Triton."""


NOT_LLMAPI = (
    "{name}: runtime {runtime!r} serves trtllm-build engines through Triton's tensorrtllm backend, and {what} "
    "serves TensorRT-LLM's LLM API only: use a `runtime: llmapi` config (build_configs/*llmapi*, *eagle3*, "
    "deepseek-v3-mtp-*)"
)


def load(source: Path, sets: Iterable[str] = (), gpu: Optional[str] = None, *, what: str) -> BuildManifest:
    """The manifest of a GPU `runtime: llmapi` BUILD_DIR or CONFIG; `what` names the launcher in errors.

    Raises LlmApiArgsError, or ConfigError/PreflightError/HardwareError from planning."""
    from ..builder.pipeline import manifest_from

    source = Path(source)
    if not source.exists():
        raise LlmApiArgsError(
            f"{source}: no such build directory or config; pass a build directory (build/NAME, written by trt-spec "
            "build) or a `runtime: llmapi` config from build_configs/"
        )
    try:
        m = manifest_from(source, tuple(sets), gpu)
    except ManifestError as e:
        raise LlmApiArgsError(str(e)) from None
    if m.deployment.runtime != "llmapi":
        raise LlmApiArgsError(NOT_LLMAPI.format(name=m.name, runtime=m.deployment.runtime.value, what=what))
    if not m.deployment.gpu:
        raise LlmApiArgsError(
            f"{source}: engine {m.engine!r} is the CPU reference deployment (trt-spec's stand-in for the LLM API); "
            f"{what} runs TensorRT-LLM on GPUs: set engine: tensorrt (with a GPU config such as "
            "build_configs/llama31-8b-eagle3-a100.yaml), or serve this one with trt-spec serve"
        )
    return m


def engine_args(m: BuildManifest, trtllm_version: Optional[str] = None) -> dict:
    """The speculative model's LLM keyword arguments, under `trtllm_version`'s speculative_config names (None: the
    1.2 line's, as model.yaml); raises LlmApiArgsError for an engine build."""
    from ..repository.llmapi import model_yaml

    if m.deployment.runtime != "llmapi":
        raise LlmApiArgsError(
            NOT_LLMAPI.format(name=m.name, runtime=m.deployment.runtime.value, what="trtllm-serve and Dynamo")
        )
    y = model_yaml(m, speculative=True, decoupled=True)
    y.pop(lc.TRITON_KEY, None)
    for k in ON_COMMAND_LINE:
        y.pop(k, None)
    unknown = sorted(set(y) - set(lc.LLM_KEYS))
    if unknown:  # a trt-spec bug, not a user's
        raise AssertionError(f"LLM argument {unknown[0]!r} is not in llmapi_contract.LLM_KEYS")
    if trtllm_version is not None and y.get("speculative_config"):
        y["speculative_config"] = lc.speculative_config_for(y["speculative_config"], trtllm_version)
    return y


def draft_dir(args: dict, trtllm_version: Optional[str] = None) -> Optional[str]:
    """The draft directory in engine_args(m, trtllm_version)'s speculative_config, or None."""
    key = lc.spec_names(trtllm_version)["model_key"] if trtllm_version else lc.SPEC_MODEL_DIR
    return (args.get("speculative_config") or {}).get(key)


def checkpoint(m: BuildManifest) -> str:
    """The checkpoint directory the LLM loads."""
    return m.target.dir


@dataclass(frozen=True)
class NodeLayout:
    """The LLM's ranks (target TP x PP) over `nodes` full nodes of `gpus_per_node` GPUs."""

    ranks: int
    nodes: int
    gpus_per_node: int


def node_layout(m: BuildManifest, gpus_per_node: Optional[int] = None) -> NodeLayout:
    """Raises LlmApiArgsError when the ranks do not split evenly over the nodes they need."""
    from ..records.defaults import GPUS_PER_NODE

    ranks = m.target.tp * m.target.pp
    per = gpus_per_node if gpus_per_node is not None else min(m.gpu.count if m.gpu else ranks, GPUS_PER_NODE)
    if per < 1:
        raise LlmApiArgsError(f"--gpus-per-node must be >= 1, got {per}")
    nodes = math.ceil(ranks / per)
    if ranks % nodes:
        raise LlmApiArgsError(
            f"{m.name}: TP{m.target.tp} x PP{m.target.pp} = {ranks} ranks do not split evenly over {nodes} nodes "
            f"of {per} GPUs; pass a --gpus-per-node that divides {ranks}"
        )
    return NodeLayout(ranks, nodes, ranks // nodes)


def check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise LlmApiArgsError(f"--port must be in 1..65535, got {port}")


def write_files(out: Path, files: dict[str, str], launch_file: str) -> Path:
    """Write a bundle to `out` atomically; refuses a directory trt-spec did not write."""
    from ..records.atomic import replacing_dir

    if out.exists() and not (out / launch_file).is_file():
        if not out.is_dir() or any(out.iterdir()):
            raise LlmApiArgsError(
                f"{out}: exists and is not a bundle trt-spec wrote; pass an empty or new --out directory"
            )
    with replacing_dir(out) as tmp:
        tmp.mkdir()
        for name, text in files.items():
            (tmp / name).write_text(text)
        (tmp / launch_file).chmod(0o755)
    return out
