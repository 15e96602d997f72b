"""The recipe table (records/recipes.py): one row per runtime x engine x mode, the combinations it refuses with the
lines the config and preflight give, and the columns the stages read."""

import pytest

from trt_spec.records.recipes import ENGINES, RECIPES, RUNTIMES, RecipeError, recipe
from trt_spec.records.speculation import Mode


def test_every_combination_has_one_row():
    assert len(RECIPES) == len(RUNTIMES) * len(ENGINES) * len(Mode)
    served = sorted((r.runtime, r.engine, r.mode.value) for r in RECIPES.values() if r.refused is None)
    assert [(rt, e, m) for rt, e, m in served if rt == "llmapi"] == [
        ("llmapi", "reference", m) for m in ("draft_target", "ngram", "none")
    ] + [("llmapi", "tensorrt", m) for m in ("draft_target", "eagle3", "mtp", "ngram", "none")]
    assert {m for rt, _, m in served if rt == "engine"} == {m.value for m in Mode if not m.llmapi_only}


@pytest.mark.parametrize(
    "runtime,engine,mode,line,fix",
    [
        (
            "engine",
            "tensorrt",
            "eagle3",
            "speculative.mode eagle3 runs on TensorRT-LLM's LLM API only; set runtime: llmapi",
            "runtime",
        ),
        (
            "llmapi",
            "reference",
            "medusa",
            "speculative.mode medusa is an engine-runtime mode (trtllm-build); set runtime: "
            "engine, or use eagle3 / mtp / draft_target / ngram on the LLM API",
            "runtime",
        ),
        (
            "llmapi",
            "reference",
            "mtp",
            "speculative.mode mtp on the CPU stand-in of the LLM API: the reference engine has "
            "no EAGLE-3 head or MTP layers; use ngram or draft_target here, or engine: tensorrt",
            "engine",
        ),
    ],
)
def test_a_refused_combination_is_one_line_naming_the_fix(runtime, engine, mode, line, fix):
    with pytest.raises(RecipeError) as e:
        recipe(runtime, engine, mode)
    assert str(e.value) == line and e.value.fix == fix
    with pytest.raises(RecipeError, match="runtime gpu, engine tensorrt: not one of"):
        recipe("gpu", "tensorrt", "ngram")


def test_columns():
    gpu = recipe("engine", "tensorrt", "medusa")
    assert gpu.steps == ("import", "distill", "checkpoint", "engine") and gpu.launcher == "mpirun"
    assert gpu.models == ("target", "heads", "baseline") and gpu.tree and gpu.backend == "tensorrtllm"
    cpu = recipe("engine", "reference", Mode.EAGLE)
    assert "train-eagle" in cpu.steps and cpu.launcher == "plain" and not cpu.tree and cpu.backend == "python"
    llm = recipe("llmapi", "tensorrt", "eagle3")
    assert llm.steps == ("import", "distill") and llm.llm_api and llm.writer == "llmapi" and not llm.openai
    assert llm.models == ("target", "heads") and llm.drafts and not llm.loop_in_bls
    assert recipe("engine", "tensorrt", "ngram").loop_in_bls and not recipe("llmapi", "tensorrt", "ngram").loop_in_bls
    assert not recipe("llmapi", "tensorrt", "none").drafts and recipe("engine", "reference", "draft_target").drafts
