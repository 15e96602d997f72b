"""`trt-spec serve` run as a user runs it (a subprocess) on a tiny deployment: the server dies with the launcher,
SIGHUP stops it cleanly, no work dir stays behind, a dead model stops serve, a model that fails to load is named with
its reason, and SIGTERM drains the requests in flight (each a server of its own: `make slow`). On the farm's shared
draft-target server (served with an admin key file): the python backend's shared memory is owner-only, the admin APIs
need the admin key, and the harness finds it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from trt_spec.harness.client import LLMClient
from trt_spec.serve.server import free_port

from ..farm import SHM, ServeProcess, refused

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def serve(farm, tmp_path):
    """Starts `trt-spec serve` on a private copy of the farm's draft-target repository (or on `repo`); whatever a
    test leaves running is killed after it."""
    started: list[ServeProcess] = []

    def start(*extra: str, repo: Path | None = None) -> ServeProcess:
        if repo is None:
            repo = farm.copy_repo("dtm", tmp_path / "repo")
        s = ServeProcess(repo, tmp_path / f"serve{len(started)}", *extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_kill_9_of_the_launcher_stops_the_server_and_its_stubs(serve):
    s = serve().wait_ready()
    procs = s.procs()
    assert any(a[0].endswith("tritonserver") for a in procs.values()) and len(s.stubs()) == 5
    s.proc.kill()
    s.proc.wait()
    assert s.wait_gone(20) == {}, "tritonserver or a stub outlived its launcher"
    assert refused(s.http) and refused(s.grpc)


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_sighup_stops_cleanly_and_removes_the_work_dir(serve, tmp_path):
    from trt_spec.serve.admin_key import admin_key_path

    key_file = tmp_path / "admin.key"
    s = serve("--admin-key-file", str(key_file)).wait_ready()
    key = key_file.read_text().strip()  # --admin-key-file: created owner-only, never printed
    assert key_file.stat().st_mode & 0o777 == 0o600 and key not in s.stderr() + s.stdout()
    assert len(s.workdirs()) == 1
    assert admin_key_path(s.http).is_file() and admin_key_path(s.grpc).is_file()  # the harness's, while it runs
    s.proc.send_signal(signal.SIGHUP)
    assert s.proc.wait(30) == 0, s.stderr()
    assert s.wait_gone(5) == {}
    assert refused(s.http) and refused(s.grpc)
    assert s.workdirs() == []
    assert not admin_key_path(s.http).exists() and not admin_key_path(s.grpc).exists()  # the key left with it
    log = s.repo.parent / f"repo.tritonserver.{s.http}.log"  # the log outlives the server, next to the repository
    assert "stopped" in s.stderr() and "Started HTTPService" in log.read_text()


@pytest.fixture(scope="module")
def keyed(farm, dtm_server):
    """The farm's draft-target server (served with an admin key file: Farm.server), after one request over each
    protocol: (server, its key file)."""
    for url, proto in ((dtm_server.http_url, "http"), (dtm_server.grpc_url, "grpc")):
        assert LLMClient(url, proto).generate("tensorrt_llm_bls", "Hello, world!", 4).output_ids
    return dtm_server, farm.root / "logs" / "dtm.admin.key"


def test_python_backend_shared_memory_is_owner_only(keyed):
    s, _ = keyed
    regions = list(SHM.glob(f"{s.spec.shm_prefix}*"))
    assert len(regions) >= 5  # one per stub
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in regions if f.stat().st_mode & 0o077} == {}


def _http(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        headers=headers or {},
        data=None if body is None else json.dumps(body).encode(),
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_admin_apis_need_the_admin_key(keyed):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    s, key_file = keyed
    register = {"key": "/trtspec_probe", "offset": 0, "byte_size": 64}
    assert _http(s.http_port, "POST", "/v2/systemsharedmemory/region/x/register", register) == 403
    assert _http(s.http_port, "POST", "/v2/logging", {"log_verbose_level": 1}) == 403
    assert _http(s.http_port, "POST", "/v2/repository/models/ensemble/unload", {}) == 403
    assert _http(s.http_port, "POST", "/v2/logging", {"log_verbose_level": 1}, {"triton-admin-key": "wrong-key"}) == 403
    g = grpcclient.InferenceServerClient(s.grpc_url)
    with pytest.raises(InferenceServerException, match="restricted"):
        g.update_log_settings({"log_verbose_level": 1})
    with pytest.raises(InferenceServerException, match="restricted"):
        g.unload_model("ensemble")
    # --admin-key-file: created owner-only, never printed, unlocks them
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    assert key not in s.log_path.read_text()  # nor in serve's own output: the SIGHUP test
    assert _http(s.http_port, "POST", "/v2/logging", {"log_verbose_level": 0}, {"triton-admin-key": key}) == 200
    g.update_log_settings({"log_verbose_level": 0}, headers={"triton-grpc-protocol-triton-admin-key": key})
    # model configs too: they name this machine's engine and tokenizer directories (absolute, as any launch needs)
    assert _http(s.http_port, "GET", "/v2/models/tensorrt_llm/config") == 403
    assert _http(s.http_port, "GET", "/v2/models/tensorrt_llm/config", headers={"triton-admin-key": key}) == 200
    with pytest.raises(InferenceServerException, match="restricted"):
        g.get_model_config("tensorrt_llm")
    cfg = g.get_model_config("tensorrt_llm", headers={"triton-grpc-protocol-triton-admin-key": key}, as_json=True)
    assert cfg["config"]["parameters"]["gpt_model_path"]["string_value"].startswith("/")
    # open: health, metadata, statistics, inference
    for path in ("/v2/health/ready", "/v2", "/v2/models/ensemble", "/v2/models/ensemble/stats"):
        assert _http(s.http_port, "GET", path) == 200, path
    assert g.is_model_ready("tensorrt_llm_bls")
    assert LLMClient(s.grpc_url, "grpc").generate("ensemble", "The quick", 3).output_ids


def test_the_harness_finds_the_key_of_a_server_on_this_host(keyed):
    """serve leaves its key 0600 in trt-spec's cache under its HTTP and gRPC ports; the harness reads model configs
    with it, given no key; a wrong key is one line naming --admin-key-file, over either protocol."""
    from trt_spec.harness.client import ClientError
    from trt_spec.serve.admin_key import admin_key_path

    s, key_file = keyed
    key = key_file.read_text().strip()
    for port, proto in ((s.http_port, "http"), (s.grpc_port, "grpc")):
        f = admin_key_path(port)
        assert f.read_text().strip() == key and f.stat().st_mode & 0o777 == 0o600
        assert f.parent.stat().st_mode & 0o077 == 0
        url = f"127.0.0.1:{port}"
        assert LLMClient(url, proto).model_config("tensorrt_llm_bls")["name"] == "tensorrt_llm_bls"
        assert LLMClient(url, proto, admin_key=key).model_config("ensemble")["name"] == "ensemble"
        with pytest.raises(ClientError) as e:
            LLMClient(url, proto, admin_key="w" * 32).model_config("ensemble")
        assert "--admin-key-file" in str(e.value) and "\n" not in str(e.value) and key not in str(e.value)
    # check without the cache file and without --admin-key-file (a client on another host): the engine runtime needs
    # no key (the runtime is read from the unrestricted metadata, the near-tie probe falls back to the loaded engine);
    # the one check that reads model configs is skipped with a note naming the option
    moved = admin_key_path(s.grpc_port).with_suffix(".moved")
    os.replace(admin_key_path(s.grpc_port), moved)
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "trt_spec.cli",
                "check",
                "--url",
                s.grpc_url,
                "--limit",
                "1",
                "--max-tokens",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: not checked that the baseline")]
        assert r.returncode == 0 and len(notes) == 1 and "--admin-key-file" in notes[0], r.stderr
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "trt_spec.cli",
                "check",
                "--url",
                s.grpc_url,
                "--limit",
                "1",
                "--max-tokens",
                "2",
                "--admin-key-file",
                str(key_file),
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
    finally:
        os.replace(moved, admin_key_path(s.grpc_port))


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_the_printed_plain_command_serves_from_another_directory(farm, tmp_path):
    """`trt-spec repo` prints the real launch; started as printed from a directory that is not the repository (only
    ports added), tritonserver loads every model (the stand-in opens gpt_model_path against the working directory,
    as the backend does) and answers."""
    from trt_spec.records.manifest import RepoRecord

    build = farm.build("dtm")
    repo = tmp_path / "repo"
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "repo", str(build), "--out", str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("or start tritonserver yourself"))
    plain = line.split(": ", 1)[1]
    assert "cd " not in plain and f"--model-repository={repo.resolve()}" in plain and RepoRecord.read(repo)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = (
        f"{plain} --http-port={http} --grpc-port={grpc} --metrics-port={metrics} --http-address=127.0.0.1 "
        f"--grpc-address=127.0.0.1 --metrics-address=127.0.0.1 --exit-timeout-secs=5"
    )
    log = tmp_path / "plain.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", cmd], cwd=elsewhere, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        else:
            pytest.fail(f"not ready:\n{log.read_text()[-3000:]}")
        c = LLMClient(f"127.0.0.1:{grpc}", "grpc")
        assert c.generate("ensemble", "The quick brown fox", 6).output_ids
        assert c.generate("tensorrt_llm_bls", "The quick brown fox", 6).output_ids
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_a_dead_python_backend_process_stops_serve_with_its_model_named(serve):
    s = serve().wait_ready()
    draft = [pid for pid, a in s.stubs().items() if "/tensorrt_llm_draft/" in a[1]]
    assert len(draft) == 1
    os.kill(draft[0], signal.SIGKILL)
    try:
        rc = s.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve still running 15 s after a stub died:\n{s.stderr()}")
    err = s.stderr()
    assert rc == 3, err  # the exit code `serve --help` documents (server.MODEL_DIED_EXIT)
    assert f"model tensorrt_llm_draft stopped (its python-backend process {draft[0]} died)" in err
    assert "restart it with: trt-spec serve" in err
    assert s.wait_gone(10) == {} and refused(s.http) and refused(s.grpc)
    assert s.workdirs() == []


@pytest.mark.slow  # a server of its own (~10 s): `make slow`, which CI runs
def test_a_start_that_times_out_names_the_models_still_loading_and_how_to_wait(serve):
    """A busy machine or a big model: the timeout names what is still loading and what its stub is doing, and how to
    wait longer, ahead of any log line (a GPU-less machine's CudaDriverHelper line said nothing about it)."""
    s = serve("--timeout", "4")  # the reference engines take longer than this to load
    rc = s.proc.wait(120)
    err = s.stderr()
    assert rc == 1, err  # a process failed (serve --help's exit codes)
    head = next(ln for ln in err.splitlines() if "not ready after 4s" in ln)
    assert "still loading " in head and "wait longer with `trt-spec serve --timeout SECONDS`" in head, head
    assert re.search(r"tensorrt_llm\w* \((stub \d+ (running|sleeping|waiting on I/O), \d+s CPU|no python stub)\)", head)
    assert s.workdirs() == [] and s.wait_gone(10) == {}


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_a_model_that_fails_to_load_is_named_with_its_reason(serve, farm, tmp_path):
    repo = farm.copy_repo("dtm", tmp_path / "repo")
    cfg = repo / "tensorrt_llm" / "config.pbtxt"
    text = cfg.read_text()
    cut = re.sub(r'parameters \{\n  key: "tokenizer_dir"\n  value \{\n    string_value: "[^"]*"\n  \}\n\}\n', "", text)
    assert cut != text
    cfg.write_text(cut)
    s = serve(repo=repo)
    rc = s.proc.wait(180)
    err = s.stderr()
    assert rc == 1, err
    lines = err.splitlines()
    cause = next(i for i, ln in enumerate(lines) if "failed to load 'tensorrt_llm'" in ln)
    assert "Cannot find parameter with name: tokenizer_dir" in lines[cause]
    assert lines[cause - 1].startswith("error: tritonserver exited with code 1 before becoming ready")
    log = Path(re.search(r"full log: (\S+)", err).group(1))
    assert log.is_file() and "tokenizer_dir" in log.read_text() and s.tmpdir not in log.parents
    assert s.workdirs() == [] and s.wait_gone(10) == {}


class _Stream(threading.Thread):
    """One streaming request over its own gRPC stream: tokens received, its error (None: finished whole)."""

    def __init__(self, url: str, model: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.tokens, self.error, self.first = 0, None, threading.Event()

    def run(self):
        import numpy as np
        import tritonclient.grpc as grpcclient

        def tensor(name, arr, dtype):
            t = grpcclient.InferInput(name, list(arr.shape), dtype)
            t.set_data_from_numpy(arr)
            return t

        q: queue.Queue = queue.Queue()
        c = grpcclient.InferenceServerClient(self.url)
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        c.async_stream_infer(
            self.model,
            [
                tensor("text_input", np.array([[b"Once upon a time"]], dtype=object), "BYTES"),
                tensor("max_tokens", np.array([[self.max_tokens]], dtype=np.int32), "INT32"),
                tensor("end_id", np.array([[-1]], dtype=np.int32), "INT32"),
                tensor("stream", np.array([[True]]), "BOOL"),
            ],
            enable_empty_final_response=True,
        )
        try:
            while True:
                result, error = q.get(timeout=120)
                if error is not None:
                    self.error = str(error)
                    return
                resp = result.get_response()
                if resp.outputs:
                    self.tokens += result.as_numpy("output_ids").size
                    self.first.set()
                if resp.parameters["triton_final_response"].bool_param:
                    return
        finally:
            self.first.set()
            c.stop_stream()
            c.close()


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_sigterm_drains_the_streams_in_flight_then_exits_0(serve):
    """SIGTERM with 16 streams of 48 tokens in flight (8 speculative, 8 ensemble): readiness turns false, a new
    request gets the "shutting down" line, all 16 finish whole, and serve exits 0. (Triton's own SIGTERM would cut
    them: once it stops, every model refuses the next engine call or postprocessing step they need.)"""
    s = serve().wait_ready()
    url = f"127.0.0.1:{s.grpc}"
    streams = [_Stream(url, ("tensorrt_llm_bls", "ensemble")[i % 2], 48) for i in range(16)]
    for st in streams:
        st.start()
    for st in streams:
        assert st.first.wait(120)
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _http(s.http, "GET", "/v2/health/ready") == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _http(s.http, "GET", "/v2/health/ready") != 200, "still ready while draining"
    assert _http(s.http, "GET", "/v2/health/live") == 200
    for model in ("tensorrt_llm_bls", "ensemble"):
        late = _Stream(url, model, 4)
        late.run()
        assert late.error and "shutting down" in late.error, late.error
    for st in streams:
        st.join(120)
    assert [(st.error, st.tokens) for st in streams] == [(None, 48)] * 16
    assert s.proc.wait(60) == 0, s.stderr()
    assert "drained in" in s.stderr() and s.wait_gone(10) == {}
    # the models unload without a stub crash: a finished request's response sender freed at interpreter exit, after
    # the stub tore down its IPC, segfaulted every stub that had served (in_triton/serving.py collect_at_finalize)
    log = (s.repo.parent / f"{s.repo.name}.tritonserver.{s.http}.log").read_text()
    assert "successfully unloaded 'tensorrt_llm_bls'" in log and "Fatal Python error" not in log, log[-3000:]


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_the_drain_timeout_ends_what_is_left_with_a_clear_error(serve):
    """--drain-timeout 0.2 with long speculative streams in flight: they end with the "shutting down" line (not a
    dropped connection), and serve still exits 0. (On a quiet machine 4 streams of 400 tokens finished within 1 s.)"""
    s = serve("--drain-timeout", "0.2").wait_ready()
    streams = [_Stream(f"127.0.0.1:{s.grpc}", "tensorrt_llm_bls", 480) for _ in range(4)]
    for st in streams:
        st.start()
    for st in streams:
        assert st.first.wait(120)
    s.proc.send_signal(signal.SIGTERM)
    for st in streams:
        st.join(60)
    assert all(st.error and "drain timeout" in st.error and st.tokens < 480 for st in streams), [
        (st.error, st.tokens) for st in streams
    ]
    assert s.proc.wait(60) == 0, s.stderr()
    assert "drain timeout (0.2s): ending" in s.stderr()


def test_serve_refuses_a_build_directory_and_names_trt_spec_repo(farm, tmp_path):
    """A build directory (manifest.json, no repository) gets one line naming the command that writes a repository,
    before any server starts (it used to start tritonserver and print a CUDA driver error)."""
    build = farm.build("dtm")
    assert (build / "manifest.json").is_file()
    r = subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", "serve", str(build), "--http-port", str(free_port())],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is a build directory, not a model repository" in r.stderr and f"trt-spec repo {build}" in r.stderr
    assert "plain command" not in r.stderr  # refused before any server process


@pytest.mark.slow  # a server of its own (~20-50 s): `make slow`, which CI runs
def test_two_servers_of_one_repository_keep_their_own_logs(serve):
    first = serve().wait_ready()
    second = serve(repo=first.repo).wait_ready()
    logs = {p: first.repo.parent / f"repo.tritonserver.{p}.log" for p in (first.http, second.http)}
    for s in (first, second):
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0, s.stderr()
    for port, log in logs.items():
        assert f"Started HTTPService at 127.0.0.1:{port}" in log.read_text(), log
