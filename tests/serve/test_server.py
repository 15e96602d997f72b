"""Server launcher without models: command lines (mpirun for TP/PP > 1), port checks, plain command."""

import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.repository.writer import write_repository
from trt_spec.serve.errors import ServerError
from trt_spec.serve.launch import ServedRepository, launch_spec
from trt_spec.serve.locate import find_tritonserver
from trt_spec.serve.server import TritonServer, check_port_free

from ..conftest import REPO
from ..farm import alive


@pytest.fixture(scope="module")
def tp2_repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2") / "repo"
    m = manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml", ["target.tp=2", "gpu=h100:2"])
    write_repository(m, out)
    return out


def test_single_model_tp2_runs_one_tritonserver_per_rank_under_mpirun(tp2_repo, tmp_path):
    spec = launch_spec(
        ServedRepository.load(tp2_repo), workdir=tmp_path, http_port=9000, grpc_port=9001, metrics_port=9002
    )
    argv = spec.argv
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count("-n") == 2 and argv.count(":") == 1
    rank0, rank1 = " ".join(argv).split(" : ")
    assert "--http-port=9000" in rank0 and "--http-address=127.0.0.1" in rank0
    assert "--model-control-mode=explicit" in rank1 and "--load-model=tensorrt_llm" in rank1
    assert "--allow-http=false" in rank1 and "--http-port" not in rank1
    assert "--model-control-mode=explicit" in rank0 and "--load-model=*" in rank0  # serve drains through it
    assert "shm-region-prefix-name=" in rank0
    # the plain command is the real launch, from any directory (the configs name absolute paths): one tritonserver per
    # rank under mpirun, the workers loading only the engine, ranks apart in shared memory (launch_triton_server.py)
    assert not spec.plain.startswith("cd ") and " && " not in spec.plain
    words = shlex.split(spec.plain)
    argv = words[words.index("mpirun") :]
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and argv.count("-n") == 2 and argv.count(":") == 1
    rank0, rank1 = " ".join(argv).split(" : ")
    assert f"{find_tritonserver()} --model-repository={tp2_repo.resolve()}" in rank0
    assert "shm-region-prefix-name=prefix0_" in rank0 and "shm-region-prefix-name=prefix1_" in rank1
    assert "--load-model=tensorrt_llm" in rank1 and "--allow-http=false" in rank1 and "--model-control" not in rank0
    assert "restricted" not in spec.plain and "--http-port" not in spec.plain  # serve's own extras


def test_two_models_with_tp_use_orchestrator_mode(tmp_path):
    out = tmp_path / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "llama33-70b-fp8-h100-tp2.yaml"), out)
    spec = launch_spec(ServedRepository.load(out), workdir=tmp_path)
    # NVIDIA's launch_triton_server.py --multi-model: one server under mpirun -n 1, no memory pools of its own
    assert spec.argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and spec.argv.count("-n") == 1
    assert spec.env["TRTLLM_ORCHESTRATOR"] == "1" and spec.env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    for flag in (
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
    ):
        assert flag in spec.argv
    # the printed plain command is this launch too (it was `cd REPO && tritonserver --model-repository=.`, which loads
    # the TP2 target in leader mode: "MPI worldSize ... equal to tp*pp*cp" fails it)
    words = shlex.split(spec.plain)
    env = dict(w.split("=", 1) for w in words[: words.index("mpirun")])
    assert env["TRTLLM_ORCHESTRATOR"] == "1" and env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "1"
    argv = words[words.index("mpirun") :]
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and argv.count("-n") == 1
    assert f"--model-repository={out.resolve()}" in argv
    for flag in (
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
    ):
        assert flag in argv


def test_plain_command_on_nvidia_pytriton_names_a_prepared_backend_directory(tmp_path):
    """On CPU the plain command needs nvidia-pytriton's backends with this interpreter's stub: a directory in trt-spec's
    cache, made by prepare_plain (serve's own work dir dies with its server), and the environment serve gives it."""
    from trt_spec.serve.locate import STUB_NAME, plain_backends_dir, pytriton_dir

    if pytriton_dir() is None:
        pytest.skip("nvidia-pytriton is not installed")
    out = tmp_path / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"), out)
    spec = launch_spec(ServedRepository.load(out))
    assert spec.plain_backends == plain_backends_dir()
    assert f"--backend-directory={plain_backends_dir()}" in spec.plain and "WORKDIR" not in spec.plain
    assert "LD_LIBRARY_PATH=" in spec.plain and f"--model-repository={out.resolve()}" in spec.plain
    spec.prepare_plain()
    spec.prepare_plain()  # once made, kept
    assert (plain_backends_dir() / "python" / STUB_NAME).is_file()
    assert (plain_backends_dir() / "python" / "libtriton_python.so").is_file()


def test_ready_timeout_grows_with_the_engines(tmp_path):
    """A cold 70B load takes minutes: serve's wait is READY_TIMEOUT_S plus READY_S_PER_ENGINE_GIB per GiB of the engine
    files the repository's record sums."""
    from dataclasses import replace

    from trt_spec.records import defaults
    from trt_spec.records.manifest import EngineSums, RepoRecord
    from trt_spec.serve.launch import ServedRepository

    out = tmp_path / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "qwen25-coder-32b-ngram-h100.yaml"), out)
    assert (
        ServedRepository.load(out).engine_bytes() == 0 and TritonServer(out).ready_timeout == defaults.READY_TIMEOUT_S
    )
    record = RepoRecord.read(out)
    files = {f"rank{i}.engine": {"size": 16 * 2**30, "sha256": "0" * 64} for i in range(2)}
    replace(record, engines={"/models/engines/target": EngineSums("engine-target", None, files)}).write(out)
    assert ServedRepository.load(out).engine_bytes() == 32 * 2**30
    want = defaults.READY_TIMEOUT_S + 32 * defaults.READY_S_PER_ENGINE_GIB
    assert TritonServer(out).ready_timeout == want == defaults.ready_timeout_s(32 * 2**30)


def test_serve_dry_run_prints_exact_command(tp2_repo):
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "serve", str(tp2_repo), "--dry-run", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "mpirun --allow-run-as-root -n 1" in r.stdout
    assert "--http-address=0.0.0.0" in r.stdout and "# plain:" in r.stdout


def test_port_in_use_is_one_clear_error(tp2_repo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"http port {port} on 127.0.0.1 is already in use; pass --http-port"):
            check_port_free("127.0.0.1", port, "http")
        r = subprocess.run(
            [sys.executable, "-m", "trt_spec.cli", "serve", str(tp2_repo), "--http-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and "already in use" in r.stderr and len(r.stderr.strip().splitlines()) <= 2


def test_missing_repository(tmp_path):
    with pytest.raises(ServerError, match="model repository not found"):
        TritonServer(tmp_path / "nope")


def test_dry_run_prepares_no_work_dir_and_shows_no_key(tp2_repo, tmp_path):
    tmp, key_file = tmp_path / "tmp", tmp_path / "admin.key"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    for extra in ([], ["--admin-key-file", str(key_file)]):
        r = subprocess.run(
            [sys.executable, "-m", "trt_spec.cli", "serve", str(tp2_repo), "--dry-run", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert list(tmp.iterdir()) == []
    assert not key_file.exists()  # dry-run reads and writes nothing
    assert 'triton-admin-key="$(cat ' + str(key_file) in r.stdout


def test_admin_apis_are_restricted_on_the_serving_rank(tp2_repo, tmp_path):
    from trt_spec.serve.admin_key import RESTRICTED_APIS

    # model-config too: the configs name this machine's engine and tokenizer directories (absolute paths)
    assert set(RESTRICTED_APIS) == {"shared-memory", "model-config", "model-repository", "trace", "logging"}
    spec = launch_spec(ServedRepository.load(tp2_repo), workdir=tmp_path)
    rank0, rank1 = " ".join(spec.argv).split(" : ")
    want = f"shared-memory,model-config,model-repository,trace,logging:triton-admin-key={spec.admin_key}"
    assert f"--http-restricted-api={want}" in rank0 and f"--grpc-restricted-protocol={want}" in rank0
    assert "-restricted-" not in rank1  # worker ranks serve no endpoint
    assert len(spec.admin_key) >= 32 and spec.admin_key not in spec.shell()
    assert (
        launch_spec(ServedRepository.load(tp2_repo), workdir=tmp_path).admin_key != spec.admin_key
    )  # random per launch
    assert launch_spec(ServedRepository.load(tp2_repo), workdir=tmp_path, admin_key="k" * 20).admin_key == "k" * 20


def test_two_servers_in_one_process_have_distinct_shared_memory_prefixes(tp2_repo, tmp_path):
    a, b = (launch_spec(ServedRepository.load(tp2_repo), workdir=tmp_path).shm_prefix for _ in range(2))
    assert a != b and not a.startswith(b) and not b.startswith(a)  # stopping one removes only its own regions


def test_admin_key_file(tmp_path):
    from trt_spec.serve.admin_key import read_admin_key

    f = tmp_path / "admin.key"
    key = read_admin_key(f)  # created, owner-only
    assert f.stat().st_mode & 0o777 == 0o600 and len(key) >= 32 and read_admin_key(f) == key
    f.write_text("short\n")
    with pytest.raises(ServerError, match="at least 16 characters"):
        read_admin_key(f)
    with pytest.raises(ServerError, match="admin key file"):
        read_admin_key(tmp_path / "no" / "such" / "dir")


FAILED_LOAD_LOG = r"""W1201 02:34:50.889 17163 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory"
E1201 02:34:50.890202 17163 server.cc:241] "CudaDriverHelper has not been initialized."
I1201 02:34:53.115804 17163 pb_stub.cc:366] "Failed to initialize Python stub: ContractError: boom"
E1201 02:34:54.183720 17163 backend_model.cc:692] "ERROR: Failed to create instance: ContractError: unexpected error when creating modelInstanceState: Cannot find parameter with name: tokenizer_dir\n\nAt:\n  /x/backend_contract.py(85): check_parameters\n  /r/tensorrt_llm/1/model.py(38): initialize\n"
E1201 02:34:54.183842 17163 model_lifecycle.cc:642] "failed to load 'tensorrt_llm' version 1: Internal: ContractError: unexpected error when creating modelInstanceState: Cannot find parameter with name: tokenizer_dir\n\nAt:\n  /x/backend_contract.py(85): check_parameters\n  /r/tensorrt_llm/1/model.py(38): initialize\n"
E1201 02:34:56.112050 17163 model_repository_manager.cc:703] "Invalid argument: ensemble 'ensemble' depends on 'tensorrt_llm' which has no loaded version."
Traceback (most recent call last):
  File "/r/preprocessing/1/model.py", line 3, in <module>
    import nope
ModuleNotFoundError: No module named 'nope'
I1201 02:34:56.113673 17163 server.cc:336] "All models are stopped, unloading models"
error: creating server: Internal - failed to load all models
"""  # noqa: E501 - a real Triton log, its lines as they are


def test_log_errors_put_the_failed_model_and_its_reason_first():
    from trt_spec.serve.triton_log import log_errors

    assert log_errors(FAILED_LOAD_LOG) == [
        "failed to load 'tensorrt_llm' version 1: Internal: ContractError: unexpected error when creating "
        "modelInstanceState: Cannot find parameter with name: tokenizer_dir "
        "(at /x/backend_contract.py(85): check_parameters)",
        "ModuleNotFoundError: No module named 'nope'",
        "error: creating server: Internal - failed to load all models",
    ]
    # no model failed to load: every error record, the ones a machine without a GPU always logs last
    other = (
        'E1201 1:2:3.4 1 server.cc:241] "CudaDriverHelper has not been initialized."\n'
        'E1201 1:2:3.5 1 http_server.cc:9] "failed to start HTTP service: address in use"\n'
    )
    assert log_errors(other) == [
        "failed to start HTTP service: address in use",
        "CudaDriverHelper has not been initialized.",
    ]


def test_stub_model_name_from_its_command_line():
    from trt_spec.serve.watchdog import stub_model

    argv = [
        "/w/backends/python/triton_python_backend_stub",
        "/repo/tensorrt_llm_draft/1/model.py",
        "trtspec1_ab_0_c7a3",
        "1048576",
        "1048576",
        "16383",
        "/w/backends/python",
        "336",
        "tensorrt_llm_draft_0_0",
        "DEFAULT",
    ]
    assert stub_model(argv) == "tensorrt_llm_draft"
    assert stub_model([argv[0], "model.py", *argv[2:]]) == "tensorrt_llm_draft"  # from the instance name


def test_serve_help_documents_the_dead_model_exit_code():
    from trt_spec.serve.supervisor import MODEL_DIED_EXIT

    r = subprocess.run([sys.executable, "-m", "trt_spec.cli", "serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and f"exit code is {MODEL_DIED_EXIT}" in " ".join(r.stdout.split())
    assert "--admin-key-file" in r.stdout and "--log" in r.stdout


def test_a_started_child_dies_with_its_launcher(tmp_path):
    """PR_SET_PDEATHSIG as TritonServer.start() sets it: kill -9 of the launcher -> SIGTERM to the child."""
    code = (
        "import subprocess, sys, time\nfrom trt_spec.records.procutil import die_with_parent\n"
        "p = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent(15), start_new_session=True)\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    try:
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and alive(child):
            time.sleep(0.05)
        assert not alive(child)
    finally:
        if alive(child):
            os.kill(child, 9)


def test_ready_timeout_of_an_llmapi_repository_counts_its_checkpoints(tmp_path):
    """Runtime llmapi has no engine files: serve's wait counts the checkpoint and the draft/head directories the
    model.yaml of the launch's model names (not the phase-only baseline), plus the LLM API's start-up work on a GPU."""
    import yaml

    from trt_spec.records import defaults
    from trt_spec.records.manifest import RepoRecord
    from trt_spec.serve.launch import ServedRepository

    ckpt, head = tmp_path / "ckpt", tmp_path / "head"
    for d, size in ((ckpt, 3 * 2**20), (head, 2**20)):
        d.mkdir()
        with open(d / "model.safetensors", "wb") as f:
            f.truncate(size)
    out = tmp_path / "repo"
    write_repository(manifest_for_config(REPO / "build_configs" / "llama31-8b-ngram-llmapi-h100.yaml"), out)
    y = out / "tensorrt_llm" / "1" / "model.yaml"
    doc = yaml.safe_load(y.read_text())
    doc["model"] = str(ckpt)
    doc["speculative_config"]["speculative_model_dir"] = str(head)
    y.write_text(yaml.safe_dump(doc))
    served = ServedRepository(out, RepoRecord.read(out))  # written off the GPU host: no NVIDIA model.py to load
    assert served.engine_bytes() == 4 * 2**20  # the phase-only baseline names the same checkpoint: counted once
    want = defaults.ready_timeout_s(4 * 2**20) + defaults.LLMAPI_READY_EXTRA_S
    assert served.ready_timeout_s() == want > defaults.READY_TIMEOUT_S + 299


def test_the_log_tells_which_models_are_still_loading():
    from trt_spec.serve.triton_log import loading_models

    log = (
        'I1207 1:2:3.4 1 model_lifecycle.cc:472] "loading: preprocessing:1"\n'
        'I1207 1:2:3.4 1 model_lifecycle.cc:472] "loading: tensorrt_llm:1"\n'
        'I1207 1:2:3.4 1 model_lifecycle.cc:472] "loading: tensorrt_llm_draft:1"\n'
        "I1207 1:2:3.5 1 model_lifecycle.cc:839] \"successfully loaded 'preprocessing'\"\n"
        "E1207 1:2:3.6 1 model_lifecycle.cc:639] \"failed to load 'tensorrt_llm_draft' version 1: Internal: x\"\n"
        'E1207 1:2:3.7 1 server.cc:241] "CudaDriverHelper has not been initialized."\n'
    )
    assert loading_models(log) == ["tensorrt_llm"]
    unloaded = log + "I1207 1:2:3.8 1 model_lifecycle.cc:624] \"successfully unloaded 'tensorrt_llm' version 1\"\n"
    assert loading_models(unloaded) == []


def test_an_llmapi_repository_on_gpus_runs_under_mpirun_as_nvidia_launches_it(tmp_path):
    """runtime llmapi on GPUs: one tritonserver under `mpirun -n 1` (NVIDIA's launch_triton_server.py, whose default is
    MPI; upstream-facts: trtllm-llmapi-launch-mpirun), in serve's launch and the plain one; on CPU, plain."""
    from trt_spec.repository.writer import repo_record
    from trt_spec.serve.locate import NGC_TRITONSERVER

    for config, sets, gpu in (
        ("llama31-8b-ngram-llmapi-h100", [], True),
        ("cpu-smollm2-ngram", ["runtime=llmapi"], False),
    ):
        m = manifest_for_config(REPO / "build_configs" / f"{config}.yaml", sets)
        assert m.deployment.runtime == "llmapi"
        served = ServedRepository(tmp_path / config, repo_record(m))
        spec = launch_spec(served, binary=NGC_TRITONSERVER, workdir=tmp_path)
        mpi = ["mpirun", "--allow-run-as-root", "-n", "1", str(NGC_TRITONSERVER)]
        assert (spec.argv[:5] == mpi) == gpu and spec.plain.startswith("mpirun --allow-run-as-root -n 1 ") == gpu
        assert served.mpi_ranks == 1 and not served.orchestrator
