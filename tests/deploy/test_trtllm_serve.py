"""trt-spec deploy trtllm-serve: goldens for every shipped `runtime: llmapi` config (and a two-node layout), the
options file against the repository's own model.yaml (one source) and the recorded LLM-API contract, the launch
script run by bash with stand-ins for trtllm-serve / srun / mpirun that record the argv they get, refusals."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trt_spec.builder.pipeline import manifest_from
from trt_spec.cli import main
from trt_spec.deploy import trtllm_serve as ts
from trt_spec.deploy.llm_api import LlmApiArgsError, checkpoint
from trt_spec.records import llmapi_contract as lc
from trt_spec.repository.writer import write_repository

from ..conftest import REPO

CONFIGS = REPO / "build_configs"
GOLDEN = REPO / "tests" / "golden" / "deploy" / "trtllm-serve"
UPDATE = os.environ.get("TRT_SPEC_UPDATE_GOLDENS") == "1"
LLMAPI = sorted(p.stem for p in CONFIGS.glob("*.yaml") if "runtime: llmapi" in p.read_text())
# bundle name -> (config, write_bundle keywords): every shipped llmapi config as planned (deepseek-v3-mtp-h100-2node:
# TP16 on two 8-GPU nodes, the multi-node launch, by the default --gpus-per-node)
CASES: dict[str, tuple[str, dict]] = {name: (name, {}) for name in LLMAPI}
TWO_NODES = "deepseek-v3-mtp-h100-2node"
BASH = shutil.which("bash")


def normalized(text: str) -> str:
    """Goldens independent of where the checkout is (config paths, and build/ paths the first-contact config plans)."""
    return text.replace(str(REPO), "<REPO>").replace(str(Path.cwd().resolve()), "<CWD>")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trtllm-serve")
    return {name: ts.write_bundle(CONFIGS / f"{cfg}.yaml", root / name, **kw) for name, (cfg, kw) in CASES.items()}


def options(bundle: Path) -> dict:
    return yaml.safe_load((bundle / ts.OPTIONS_FILE).read_text())


def serve_commands(script: str) -> list[list[str]]:
    """Every command line of launch.sh that runs trtllm-serve, split as the shell would (continuations joined)."""
    joined = script.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if ts.SERVE in line and not line.lstrip().startswith("#")]


def test_every_llmapi_config_is_covered():
    assert len(LLMAPI) >= 6 and "deepseek-v3-mtp-h200" in LLMAPI
    assert set(LLMAPI) <= set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(bundles, name):
    d = GOLDEN / name
    if UPDATE:
        d.mkdir(parents=True, exist_ok=True)
        for f in ts.BUNDLE_FILES:
            (d / f).write_text(normalized((bundles[name] / f).read_text()))
    for f in ts.BUNDLE_FILES:
        golden = d / f
        assert golden.is_file(), (
            f"missing golden {golden}; run TRT_SPEC_UPDATE_GOLDENS=1 pytest tests/deploy/test_trtllm_serve.py"
        )
        assert normalized((bundles[name] / f).read_text()) == golden.read_text(), f"{name}/{f}"
    assert sorted(p.name for p in bundles[name].iterdir()) == sorted(ts.BUNDLE_FILES)


@pytest.mark.parametrize("name", LLMAPI)
def test_options_are_model_yaml_less_model_and_triton_config(bundles, name, tmp_path):
    """One source: the options file is the model.yaml `trt-spec repo` writes for the same config, key for key."""
    m = manifest_from(CONFIGS / f"{name}.yaml")
    write_repository(m, tmp_path / "repo")
    model_yaml = yaml.safe_load((tmp_path / "repo" / lc.MODEL_NAME / "1" / lc.YAML_FILE).read_text())
    got = options(bundles[name])
    assert set(got) <= set(lc.LLM_KEYS)
    assert set(got.get("kv_cache_config", {})) <= set(lc.KV_CACHE_KEYS)
    assert set(got.get("cuda_graph_config", {})) <= set(lc.CUDA_GRAPH_KEYS)
    assert model_yaml.pop("model") == checkpoint(m)
    model_yaml.pop(lc.TRITON_KEY)
    assert got == model_yaml
    assert got["speculative_config"]["decoding_type"] in lc.DECODING_TYPES.values()


@pytest.mark.parametrize("name", sorted(CASES))
def test_launch_flags_are_recorded_and_carry_the_options_values(bundles, name):
    script = (bundles[name] / ts.LAUNCH_FILE).read_text()
    cmds = serve_commands(script)
    assert cmds, "no trtllm-serve line"
    opts = options(bundles[name])
    for argv in cmds:
        i = argv.index(ts.SERVE)
        model, rest = argv[i + 1], argv[i + 2 :]
        assert not model.startswith("-")
        assert len(rest) % 2 == 0
        flags = dict(zip(rest[::2], rest[1::2]))
        assert len(flags) == len(rest) // 2, "a flag given twice"
        assert set(flags) <= lc.TRTLLM_SERVE_FLAGS, set(flags) - lc.TRTLLM_SERVE_FLAGS
        assert flags["--host"] == lc.TRTLLM_SERVE_HOST and flags["--port"] == str(lc.TRTLLM_SERVE_PORT)
        assert flags["--extra_llm_api_options"] == f"$HERE/{ts.OPTIONS_FILE}"
        for flag, path in ts.FLAG_KEYS.items():
            want = opts
            for k in path:
                want = want[k]
            assert yaml.safe_load(flags[flag]) == want, flag


def _stand_ins(bin_dir: Path, names: list[str], log: Path) -> dict:
    """Executables that write their argv (one per line) to `log` and exit 0: what the script would run."""
    bin_dir.mkdir()
    for n in names:
        f = bin_dir / n
        f.write_text(f'#!/usr/bin/env bash\n{{ echo "{n}"; printf "%s\\n" "$@"; }} > "{log}"\n')
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(BASH is None, reason="no bash")
@pytest.mark.parametrize("name", ["llama33-70b-eagle3-h200", "deepseek-v3-mtp-h200"])
def test_single_node_launch_runs_trtllm_serve_with_the_options_file(bundles, name, tmp_path):
    log = tmp_path / "argv"
    env = _stand_ins(tmp_path / "bin", [ts.SERVE], log)
    r = subprocess.run([BASH, str(bundles[name] / ts.LAUNCH_FILE)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv = log.read_text().splitlines()
    assert argv[0] == ts.SERVE and argv[1] == checkpoint(manifest_from(CONFIGS / f"{name}.yaml"))
    opts_file = Path(argv[argv.index("--extra_llm_api_options") + 1])
    assert opts_file.resolve() == (bundles[name] / ts.OPTIONS_FILE).resolve()
    assert yaml.safe_load(opts_file.read_text()) == options(bundles[name])


@pytest.mark.skipif(BASH is None, reason="no bash")
def test_two_nodes_run_every_rank_under_trtllm_llmapi_launch(bundles, tmp_path):
    script = bundles[TWO_NODES] / ts.LAUNCH_FILE
    log = tmp_path / "argv"
    env = _stand_ins(tmp_path / "bin", ["srun", "mpirun"], log)
    r = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv = log.read_text().splitlines()
    head = argv[: argv.index(ts.SERVE)]
    assert head == [
        "srun",
        "-N",
        "2",
        "--ntasks",
        "16",
        "--ntasks-per-node",
        "8",
        "--mpi=pmix",
        lc.TRTLLM_LLMAPI_LAUNCH,
    ]
    assert argv[argv.index("--tp_size") + 1] == "16"

    bad = subprocess.run([BASH, str(script)], env={**env, "LAUNCHER": "mpirun"}, capture_output=True, text=True)
    assert bad.returncode != 0 and "HOSTS" in bad.stderr
    r = subprocess.run(
        [BASH, str(script)], env={**env, "LAUNCHER": "mpirun", "HOSTS": "a:8,b:8"}, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    argv = log.read_text().splitlines()
    assert argv[: argv.index(ts.SERVE)] == ["mpirun", "-np", "16", "-H", "a:8,b:8", lc.TRTLLM_LLMAPI_LAUNCH]
    other = subprocess.run([BASH, str(script)], env={**env, "LAUNCHER": "pdsh"}, capture_output=True, text=True)
    assert other.returncode == 2 and "srun or mpirun" in other.stderr


def test_engine_runtime_configs_are_refused_in_one_line_before_writing(tmp_path):
    out = tmp_path / "b"
    with pytest.raises(LlmApiArgsError, match=r"runtime 'engine' .* use a `runtime: llmapi` config") as e:
        ts.write_bundle(CONFIGS / "llama33-70b-fp8-h200.yaml", out)
    assert "\n" not in str(e.value) and not out.exists()


def test_cpu_reference_configs_are_refused_in_one_line(tmp_path):
    with pytest.raises(LlmApiArgsError, match="CPU reference deployment.*trtllm-serve runs TensorRT-LLM on GPUs") as e:
        ts.write_bundle(CONFIGS / "cpu-smollm2-draft.yaml", tmp_path / "b", sets=["runtime=llmapi"])
    assert "\n" not in str(e.value) and not (tmp_path / "b").exists()


def test_uneven_nodes_and_foreign_out_dirs_are_refused(tmp_path):
    with pytest.raises(LlmApiArgsError, match="divides 8"):
        ts.write_bundle(CONFIGS / "deepseek-v3-mtp-h200.yaml", tmp_path / "b", gpus_per_node=3)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(LlmApiArgsError, match="not a bundle trt-spec wrote"):
        ts.write_bundle(CONFIGS / "llama31-8b-eagle3-a100.yaml", foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_rewrite_over_an_earlier_bundle_replaces_it(tmp_path):
    out = tmp_path / "b"
    ts.write_bundle(CONFIGS / "llama31-8b-eagle3-a100.yaml", out)
    (out / "stale").write_text("x")
    ts.write_bundle(CONFIGS / "llama31-8b-eagle3-a100.yaml", out, port=8123)
    assert sorted(p.name for p in out.iterdir()) == sorted(ts.BUNDLE_FILES)
    assert "--port 8123" in (out / ts.LAUNCH_FILE).read_text()
    assert os.access(out / ts.LAUNCH_FILE, os.X_OK)


def test_cli(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(
        main,
        ["deploy", "trtllm-serve", str(CONFIGS / "llama31-8b-ngram-llmapi-h100.yaml"), "--out", str(tmp_path / "b")],
    )
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "b" / ts.LAUNCH_FILE).is_file()
    bad = runner.invoke(
        main, ["deploy", "trtllm-serve", str(CONFIGS / "llama31-8b-a100.yaml"), "--out", str(tmp_path / "c")]
    )
    assert bad.exit_code == 2
    assert len(bad.output.strip().splitlines()) == 1 and "runtime: llmapi" in bad.output
