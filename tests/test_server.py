"""Server launcher without models: command lines (mpirun for TP/PP > 1), port checks, plain command."""

import socket
import subprocess
import sys

import pytest

from trt_spec.repository import manifest_for_config, write_repository
from trt_spec.server import ServerError, TritonServer, check_port_free, launch_spec

from .conftest import REPO


@pytest.fixture(scope="module")
def tp2_repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2") / "repo"
    m = manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml",
                            ["target.tp=2", "gpu=h100:2"])
    write_repository(m, out)
    return out


def test_single_model_tp2_runs_one_tritonserver_per_rank_under_mpirun(tp2_repo, tmp_path):
    spec = launch_spec(tp2_repo, workdir=tmp_path, http_port=9000, grpc_port=9001, metrics_port=9002)
    argv = spec.argv
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count("-n") == 2 and argv.count(":") == 1
    rank0, rank1 = " ".join(argv).split(" : ")
    assert "--http-port=9000" in rank0 and "--http-address=127.0.0.1" in rank0
    assert "--model-control-mode=explicit" in rank1 and "--load-model=tensorrt_llm" in rank1
    assert "--allow-http=false" in rank1 and "--http-port" not in rank1
    assert "shm-region-prefix-name=" in rank0 and spec.plain.endswith(f"--model-repository={tp2_repo.resolve()}")


def test_two_models_with_tp_use_orchestrator_mode(tmp_path):
    out = tmp_path / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"), out)
    spec = launch_spec(out, workdir=tmp_path)
    # NVIDIA's launch_triton_server.py --multi-model: one server under mpirun -n 1, no memory pools of its own
    assert spec.argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and spec.argv.count("-n") == 1
    assert spec.env["TRTLLM_ORCHESTRATOR"] == "1" and spec.env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    for flag in ("--pinned-memory-pool-byte-size=0", "--enable-peer-access=false", "--cuda-memory-pool-byte-size=0:0",
                 "--cuda-memory-pool-byte-size=1:0"):
        assert flag in spec.argv


def test_serve_dry_run_prints_exact_command(tp2_repo):
    r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "serve", str(tp2_repo), "--dry-run", "--host", "0.0.0.0"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "mpirun --allow-run-as-root -n 1" in r.stdout
    assert "--http-address=0.0.0.0" in r.stdout and "# plain:" in r.stdout


def test_port_in_use_is_one_clear_error(tp2_repo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"http port {port} on 127.0.0.1 is already in use; pass --http-port"):
            check_port_free("127.0.0.1", port, "http")
        r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "serve", str(tp2_repo), "--http-port", str(port)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "already in use" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


def test_missing_repository(tmp_path):
    with pytest.raises(ServerError, match="model repository not found"):
        TritonServer(tmp_path / "nope")
