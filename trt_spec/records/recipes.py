"""What runs for a config: one row per runtime x engine x mode, read by preflight, the planner, the repository writer
and the Kubernetes bundle instead of each comparing the three strings itself.

A row says which build steps the plan makes, which models the build produces and the deployment loads, how the
repository is launched, and which repository writer writes it. Combinations trt-spec does not serve are rows too,
with the one line that refuses them (`recipe()` raises it); their other columns still hold, so a check that runs
before the refusal is due (preflight keeps its order of checks) can read the table.

  runtime engine     steps                                       launcher  models
  engine  tensorrt   import, distill, checkpoint, engine         mpirun    target (+ draft | heads, baseline)
  engine  reference  import, distill, (train-eagle,) export      plain     target (+ draft | heads, baseline)
  llmapi  tensorrt   import, distill (checkpoints served as-is)  llmapi    target (+ draft | heads)
  llmapi  reference  import, distill, export (the CPU stand-in)  llmapi    target (+ draft)

(import and distill run only where the config names a GGUF target or a draft to distill.)
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
    """A runtime x engine x mode trt-spec does not serve: one line naming it and the fix. `fix`: the key to change."""

    def __init__(self, line: str, fix: str):
        super().__init__(line)
        self.fix = fix


@dataclass(frozen=True)
class Recipe:
    runtime: str
    engine: str
    mode: Mode
    steps: tuple[str, ...]  # the plan's step kinds, in order
    models: tuple[str, ...]  # target, draft (a draft model), heads (the mode's head checkpoint), baseline (an engine)
    launcher: str  # mpirun (a rank per GPU, or orchestrator mode) | plain (one process) | llmapi (the LLM spawns ranks)
    refused: Optional[str] = None  # the line that refuses the combination (None: served)
    fix: Optional[str] = None  # the key the refusal asks to change: runtime | engine

    @property
    def gpu(self) -> bool:
        """Runs on GPUs (TensorRT-LLM): devices, parallelism and the memory plan are checked."""
        return self.engine == "tensorrt"

    @property
    def writer(self) -> str:
        """The repository writer: engine (the tensorrt_llm models, ensemble and BLS) | llmapi (the LLM-API model)."""
        return self.runtime

    @property
    def backend(self) -> str:
        """The engine models' Triton backend: tensorrtllm on a GPU, python (the reference engine) on CPU."""
        return "tensorrtllm" if self.gpu else "python"

    @property
    def llm_api(self) -> bool:
        """TensorRT-LLM's LLM API (or its CPU stand-in) serves it: one process loads the target and its draft or head
        on the target's GPUs, sizes one KV-cache pool, and speculates inside."""
        return self.launcher == "llmapi"

    @property
    def tree(self) -> bool:
        """The target engine drafts a tree (Medusa / EAGLE-1 choices) max_draft_len must hold; the reference engine
        drafts a chain."""
        return self.gpu and self.mode in (Mode.MEDUSA, Mode.EAGLE)

    @property
    def openai(self) -> bool:
        """trt-spec's OpenAI frontend serves it (it speaks to the BLS and the ensemble)."""
        return not self.llm_api

    @property
    def loop_in_bls(self) -> bool:
        """The BLS runs the draft -> verify loop (the engine runtime's draft-target and n-gram)."""
        return not self.llm_api and self.mode.loop_in_bls

    @property
    def drafts(self) -> bool:
        """Something drafts at a draft length the config sets (max_draft_len must be >= 1)."""
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
    if engine == "reference":  # reference engines are exported (the LLM-API stand-in serves them too)
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
    """The row of a served runtime x engine x mode; RecipeError (one line) for one trt-spec does not serve."""
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
