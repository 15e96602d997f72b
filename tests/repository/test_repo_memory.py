"""The memory plan of the repository `trt-spec repo` writes (repository/memory.py over records/memory.py): every shipped
GPU config (engine and llmapi runtime) fits as its repository is served, and a repository that would hold two models
sizing their KV cache by share on one GPU, or more than a GPU holds, is refused with one line before anything is
written."""

from __future__ import annotations

import dataclasses

import pytest

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.records import llmapi_contract as lc
from trt_spec.records.memory import concurrent_sets, repository_overflow
from trt_spec.repository import llmapi as lr
from trt_spec.repository import memory as repo_memory
from trt_spec.repository.writer import RepositoryError, repo_record, write_repository

from ..conftest import BUILD_CONFIGS, REPO

GPU_CONFIGS = [p for p in BUILD_CONFIGS if not p.stem.startswith("cpu-")]
LLMAPI_70B = REPO / "build_configs" / "llama33-70b-eagle3-h200.yaml"


def _models(m):
    if m.config.runtime == "llmapi":
        models = lr.llmapi_models(m, True)
        return {n: c for n, (c, _) in models.items()}, {n: y for n, (_, y) in models.items()}
    from trt_spec.repository.writer import repository_configs

    return repository_configs(m.deployment, m.engines), {}


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_gpu_config_fits_as_its_repository_is_served(path):
    m = manifest_for_config(path)
    configs, yamls = _models(m)
    record = repo_record(m, True)
    assert repo_memory.overflow(m, configs, yamls, record) is None
    rows = repo_memory.plan_rows(m, configs, yamls, record)
    assert rows["launch"], "every GPU config loads weights"
    for what, rs in rows.items():
        for gid in {r.gpu_id for r in rs}:
            assert sum(r.total_gib for r in rs if r.gpu_id == gid) <= m.gpu.memory_gib, (what, gid)
    if m.config.runtime == "llmapi":  # the baseline copy is counted, in its own phase, never beside the target
        assert record.load_models == [lc.MODEL_NAME] and record.phase_models == {lc.BASELINE_MODEL: [lc.MODEL_NAME]}
        assert set(rows) == {"launch", f"phase {lc.BASELINE_MODEL}"}
        assert {r.role for r in rows[f"phase {lc.BASELINE_MODEL}"]} == {"target"}


def test_the_old_llmapi_layout_that_co_loads_both_copies_is_refused(tmp_path):
    m = manifest_for_config(LLMAPI_70B)
    configs, yamls = _models(m)
    old = dataclasses.replace(repo_record(m, True), load_models=[], phase_models={})  # --load-model=*: both at once
    line = repo_memory.overflow(m, configs, yamls, old)
    assert line is not None and "\n" not in line
    assert line.startswith("GPU 0 (h200, 140.4 GiB) would hold") and "tensorrt_llm_baseline" in line
    # on a GPU large enough for both copies' weights, the two shares of free memory still collide
    assert "each sizes its KV cache as a share of the free memory" in repository_overflow(
        repo_memory.instances(m, configs, yamls),
        concurrent_sets(sorted(configs), [], {}),
        m.config.limits,
        m.config.serving.memory_reserve_gib,
        "big",
        1e4,
        1,
    )


def test_repo_refuses_a_repository_that_overflows_a_gpu_before_writing(tmp_path):
    """A build directory whose manifest asks for more than the GPU holds (limits raised after the build's plan)."""
    m = manifest_for_config(LLMAPI_70B)
    big = m.config.model_copy(update={"limits": m.config.limits.model_copy(update={"max_batch_size": 64})})
    d = m.deployment
    big_d = dataclasses.replace(d, limits=dataclasses.replace(d.limits, max_batch_size=64))  # what the writer reads
    with pytest.raises(RepositoryError) as e:
        write_repository(dataclasses.replace(m, config=big, deployment=big_d), tmp_path / "r")
    assert "\n" not in str(e.value) and str(e.value).startswith("GPU 0 (h200, 140.4 GiB)")
    assert "lower limits.max_batch_size" in str(e.value) and not (tmp_path / "r").exists()
