"""What runs for a config: one row per runtime x engine x mode (build steps, models, launcher, writer).

Unserved combinations are rows too, holding the line that refuses them, so checks that run before the refusal can
still read their other columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Optional

from ..errors import TrtSpecError
from .speculation import Mode

RUNTIMES = ("engine", "llmapi")  # config `runtime:`
ENGINES = ("tensorrt", "reference")  # config `engine:`


class RecipeError(TrtSpecError, ValueError):
    """A runtime x engine x mode trt-spec does not serve; `fix` is the config key to change."""

    def __init__(self, line: str, fix: str):
        super().__init__(line)
        self.fix = fix


@dataclass(frozen=True)
class Recipe:
    runtime: str
    engine: str
    mode: Mode
    steps: tuple[str, ...]  # in plan order
    models: tuple[str, ...]  # target | draft | heads | baseline
    launcher: str  # mpirun | plain (one process) | llmapi (the LLM spawns ranks)
    refused: Optional[str] = None  # None: served
    fix: Optional[str] = None  # runtime | engine

    @property
    def gpu(self) -> bool:
        """Runs on GPUs (TensorRT-LLM)."""
        return self.engine == "tensorrt"

    @property
    def writer(self) -> str:
        """The repository writer: engine | llmapi."""
        return self.runtime

    @property
    def backend(self) -> str:
        """The engine models' Triton backend."""
        return "tensorrtllm" if self.gpu else "python"

    @property
    def llm_api(self) -> bool:
        """The LLM API (or its CPU stand-in) serves it: one process, one KV-cache pool, speculation inside."""
        return self.launcher == "llmapi"

    @property
    def tree(self) -> bool:
        """The target engine drafts a tree that max_draft_len must hold; the reference engine drafts a chain."""
        return self.gpu and self.mode in (Mode.MEDUSA, Mode.EAGLE)

    @property
    def openai(self) -> bool:
        """trt-spec's OpenAI frontend serves it."""
        return not self.llm_api

    @property
    def loop_in_bls(self) -> bool:
        """The BLS runs the draft -> verify loop."""
        return not self.llm_api and self.mode.loop_in_bls

    @property
    def drafts(self) -> bool:
        """Something drafts at a config-set draft length (max_draft_len must be >= 1)."""
        return self.mode is not Mode.NONE and (self.mode.loop_in_bls or self.llm_api)


def _refusal(runtime: str, engine: str, mode: Mode) -> tuple[Optional[str], Optional[str]]:
    if runtime == "engine" and mode.llmapi_only:
        return f"speculative.mode {mode} runs on TensorRT-LLM's LLM API only; set runtime: llmapi", "runtime"
    if runtime == "llmapi" and mode.engine_only:
        return (
            f"speculative.mode {mode} is an engine-runtime mode (trtllm-build); set runtime: engine, or use "
            "eagle3 / mtp / draft_target / ngram on the LLM API",
            "runtime",
        )
    if runtime == "llmapi" and engine == "reference" and mode.llmapi_only:
        return (
            f"speculative.mode {mode} on the CPU stand-in of the LLM API: the reference engine has no EAGLE-3 head "
            "or MTP layers; use ngram or draft_target here, or engine: tensorrt",
            "engine",
        )
    return None, None


def _row(runtime: str, engine: str, mode: Mode) -> Recipe:
    if engine == "reference":  # exported (the LLM-API stand-in serves them too)
        steps = ("import", "distill") + (("train-eagle",) if mode is Mode.EAGLE else ()) + ("export",)
    elif runtime == "engine":
        steps = ("import", "distill", "checkpoint", "engine")
    else:  # the LLM API serves the checkpoints as they are
        steps = ("import", "distill")
    models = (
        ("target",)
        + (("draft",) if mode is Mode.DRAFT_TARGET else ())
        + (("heads",) if mode in (Mode.MEDUSA, Mode.EAGLE, Mode.EAGLE3) else ())
        + (("baseline",) if runtime == "engine" and mode.in_engine else ())
    )  # unless speculative.baseline_engine false
    launcher = "llmapi" if runtime == "llmapi" else "mpirun" if engine == "tensorrt" else "plain"
    refused, fix = _refusal(runtime, engine, mode)
    return Recipe(runtime, engine, mode, steps, models, launcher, refused, fix)


RECIPES: dict[tuple[str, str, Mode], Recipe] = {
    (r, e, m): _row(r, e, m) for r, e, m in product(RUNTIMES, ENGINES, Mode)
}


def recipe(runtime: str, engine: str, mode: str | Mode) -> Recipe:
    """The row of a served runtime x engine x mode; raises RecipeError for an unserved one."""
    row = RECIPES.get((runtime, engine, Mode(mode)))
    if row is None:
        raise RecipeError(
            f"runtime {runtime}, engine {engine}: not one of runtime {' | '.join(RUNTIMES)}, engine "
            f"{' | '.join(ENGINES)}",
            "runtime" if runtime not in RUNTIMES else "engine",
        )
    if row.refused:
        raise RecipeError(row.refused, row.fix or "runtime")
    return row
