"""The test farm: every tiny deployment the suite needs, built once per session, and every server that only answers
requests, started once and shared (docs/testing.md: "The farm").

- `Farm.build(name)`: the deployment DEPLOYMENTS[name] built by trt-spec's own builder (build dir; config beside it);
- `Farm.repo(name)`: a repository written from a build; REPOS names the variants (unary, a queue of 2, a broken BLS);
- `Farm.server(name)`: that repository served by one real tritonserver for the whole session;
- `Farm.openai(name)`: the OpenAI frontend `trt-spec serve --openai-port` starts, in front of a shared server.

Tests that own a server's life (kill -9, SIGTERM drain, a dead stub, keys on the command line) start their own with
`ServeProcess` (`trt-spec serve` as a user runs it) on a repository copied from a farm build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LIMITS = {"max_batch_size": 4, "max_input_len": 384, "max_seq_len": 512, "max_num_tokens": 512}
MAX_QUEUE = 2  # the "faulty" repository's engine queue (tests/e2e/test_batching.py)


@dataclass(frozen=True)
class Spec:
    """One tiny deployment: its speculative mode over the farm's tiny target (models(): target or chat_target)."""

    mode: str
    k: int = 4
    draft: Optional[str] = None  # a key of models()
    target: str = "target"
    runtime: str = "engine"
    speculative: dict = field(default_factory=dict)


DEPLOYMENTS = {
    # draft-target, a draft that is another random model (partial acceptance); k 5: NVIDIA's clients' default
    "dtm": Spec("draft_target", k=5, draft="draft_other"),
    "dtm_copy": Spec("draft_target", draft="draft_copy", target="chat_target"),  # the draft is the target
    "ngram": Spec("ngram", target="chat_target"),
    # fixed chains: the engine drafts every step whatever a loaded machine measures its costs to be at load
    "eagle": Spec(
        "eagle",
        speculative={"draft_len_policy": "fixed", "eagle": {"train": {"steps": 40, "prompts": 32, "draft_vocab": 256}}},
    ),
    "dtm_fixed": Spec("draft_target", draft="draft_other", speculative={"draft_len_policy": "fixed"}),
    "llmapi": Spec("ngram", target="chat_target", runtime="llmapi"),
    "lookahead": Spec("lookahead", k=15),  # (N-2)+(W-1+G)(N-1) for 4,3,4
}


@dataclass(frozen=True)
class Repo:
    """A repository written from DEPLOYMENTS[build]: write_repository's options, then an optional edit."""

    build: str
    options: dict = field(default_factory=dict)
    edit: Optional[Callable[[Path], None]] = None


def _break_bls(repo: Path) -> None:
    """The BLS accepts every draft token unverified (BROKEN_BLS), with a fixed draft length: its output then depends
    on what it drafts, and the adaptive policy's choices on timing."""
    version = repo / "tensorrt_llm_bls" / "1"
    (version / "model.py").rename(version / "shipped_model.py")
    (version / "model.py").write_text(BROKEN_BLS)
    cfg = repo / "tensorrt_llm_bls" / "config.pbtxt"
    text = cfg.read_text()
    assert text.count('string_value: "adaptive"') == 1
    cfg.write_text(text.replace('string_value: "adaptive"', 'string_value: "fixed"'))


REPOS = {
    "dtm": Repo("dtm"),
    "dtm_unary": Repo("dtm", {"decoupled": False}),  # NVIDIA's --no-decoupled DTM recipe
    "ngram": Repo("ngram"),
    "eagle": Repo("eagle"),
    "llmapi": Repo("llmapi"),
    "lookahead": Repo("lookahead"),
    # the deliberately faulty draft-target repository: an engine queue of MAX_QUEUE (test_batching) and a BLS that
    # accepts drafts unverified (test_harness); both are read only by tests that send one request at a time or own
    # every engine slot, so they share one server
    "faulty": Repo("dtm", {"max_queue_size": MAX_QUEUE}, _break_bls),
}

# The broken BLS: the shipped model.py, kept whole under another name, loaded by path and subclassed. Its engine
# calls go through the shipped _call (and so its _held/_checkpoint bookkeeping); only the target's verification
# result is replaced: the target "accepts" every draft token and adds its own last token.
BROKEN_BLS = '''"""tensorrt_llm_bls with broken verification: every draft token is accepted unverified."""
import importlib.util
import sys
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("shipped_tensorrt_llm_bls", Path(__file__).with_name("shipped_model.py"))
shipped = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = shipped
_spec.loader.exec_module(shipped)


class TritonPythonModel(shipped.TritonPythonModel):
    async def _call(self, model, inputs, outputs, on_response=None):
        res = await super()._call(model, inputs, outputs, on_response)
        d = inputs.get("draft_input_ids")
        if d is not None and res:
            last = res[-1]["output_ids"].reshape(-1)[int(res[-1]["sequence_length"].reshape(-1)[0]) - 1]
            toks = [int(x) for x in d.reshape(-1)] + [int(last)]
            res = [{"output_ids": np.asarray(toks, np.int32).reshape(1, 1, -1),
                    "sequence_length": np.asarray([[len(toks)]], np.int32)}]
        return res
'''


def build_deployment(
    root: Path,
    mode: str,
    draft_dir: Optional[Path],
    target_dir: Path,
    k: int = 4,
    speculative: Optional[dict] = None,
    runtime: str = "engine",
) -> Path:
    """trt-spec's builder on a tiny config under root (root/MODE.yaml, root/build), then its repository (root/repo)."""
    from trt_spec.builder.plan import make_plan
    from trt_spec.builder.preflight import run_preflight
    from trt_spec.builder.runner import run_plan
    from trt_spec.records.config import load_config
    from trt_spec.records.manifest import BuildManifest
    from trt_spec.repository.writer import write_repository

    root.mkdir(parents=True, exist_ok=True)
    cfg = {
        "engine": "reference",
        **({"runtime": "llmapi"} if runtime == "llmapi" else {}),
        "target": {"checkpoint": str(target_dir)},
        "quantization": {"weights": "fp32"},
        "speculative": {
            "mode": mode,
            "max_draft_len": k,
            **({"ngram_size": 3} if mode == "ngram" else {}),
            **(speculative or {}),
        },
        "limits": dict(LIMITS),
        "output_dir": str(root / "build"),
    }
    if draft_dir is not None:
        cfg["draft"] = {"checkpoint": str(draft_dir)}
    path = root / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = load_config(path)
    run_plan(make_plan(c, run_preflight(c, None, require_checkpoints=True), path), config_path=path)
    repo = root / "repo"
    write_repository(BuildManifest.read(root / "build"), repo)
    return repo


def tokenizer_dir(repo: Path) -> str:
    """The tokenizer directory a repository's preprocessing model loads (written relative to the repository)."""
    from trt_spec.in_triton.serving import repo_path

    cfg = (repo / "preprocessing" / "config.pbtxt").read_text()
    rel = cfg.split('key: "tokenizer_dir"')[1].split('string_value: "')[1].split('"')[0]
    return repo_path(str(repo / "preprocessing"), rel)


class Farm:
    """Lazy and session-wide: nothing is built or started until a test asks for it, and nothing twice."""

    def __init__(self, root: Path):
        self.root = root
        self._models: Optional[dict] = None
        self._builds: dict[str, Path] = {}
        self._repos: dict[str, Path] = {}
        self.servers: dict = {}  # name -> TritonServer, in start order
        self._frontends: dict = {}

    def models(self) -> dict:
        """The tiny byte-level tokenizer and random Llama models every deployment is built from."""
        if self._models is None:
            from .tiny import make_model, make_tokenizer

            root = self.root / "models"
            tok = make_tokenizer(root / "tok")
            target = make_model(root / "target", tok, seed=0)
            chat = root / "chat_target"  # the target, its tokenizer with a chat template (the OpenAI chat API)
            shutil.copytree(target, chat)
            cfg = json.loads((chat / "tokenizer_config.json").read_text())
            (chat / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": CHATML}))
            self._models = {
                "tokenizer": tok,
                "target": target,
                "chat_target": chat,
                "draft_copy": make_model(root / "draft_copy", tok, copy_from=target),
                "draft_other": make_model(root / "draft_other", tok, seed=1),
            }
        return self._models

    def build(self, name: str) -> Path:
        """DEPLOYMENTS[name]'s build directory (its config: config(name))."""
        if name not in self._builds:
            spec, m = DEPLOYMENTS[name], self.models()
            root = self.root / "builds" / name
            build_deployment(
                root,
                spec.mode,
                m[spec.draft] if spec.draft else None,
                m[spec.target],
                k=spec.k,
                speculative=spec.speculative,
                runtime=spec.runtime,
            )
            self._builds[name] = root / "build"
        return self._builds[name]

    def config(self, name: str) -> Path:
        self.build(name)
        return self.root / "builds" / name / f"{DEPLOYMENTS[name].mode}.yaml"

    def repo(self, name: str) -> Path:
        """REPOS[name] written from its build (the default variant is the one the build wrote)."""
        if name not in self._repos:
            from trt_spec.records.manifest import BuildManifest
            from trt_spec.repository.writer import write_repository

            r = REPOS[name]
            build = self.build(r.build)
            if not r.options and r.edit is None:
                self._repos[name] = build.parent / "repo"
            else:
                out = self.root / "repos" / name
                write_repository(BuildManifest.read(build), out, **r.options)
                if r.edit:
                    r.edit(out)
                self._repos[name] = out
        return self._repos[name]

    def copy_repo(self, name: str, dest: Path) -> Path:
        """A private copy of a farm repository (as cp -r: the engine links stay links), for a test that edits it or
        owns its server."""
        shutil.copytree(self.repo(name), dest, symlinks=True)
        return dest

    def server(self, name: str):
        """REPOS[name] served by one tritonserver for the session (its log: root/logs/NAME.log)."""
        if name not in self.servers:
            from trt_spec.serve.server import TritonServer, free_port

            repo = self.repo(name)
            (self.root / "logs").mkdir(exist_ok=True)
            server = TritonServer(
                repo,
                http_port=free_port(),
                grpc_port=free_port(),
                metrics_port=free_port(),
                log_path=self.root / "logs" / f"{name}.log",
                admin_key_file=self.root / "logs" / f"{name}.admin.key",
            )
            self.servers[name] = server
            server.start().wait_ready(180)
        return self.servers[name]

    def openai(self, name: str):
        """The OpenAI frontend of `trt-spec serve --openai-port` in front of server(name), and an openai SDK client."""
        if name not in self._frontends:
            import openai

            from trt_spec.serve.launch import ServedRepository
            from trt_spec.serve.openai.process import FrontendProcess
            from trt_spec.serve.server import free_port

            server = self.server(name)
            log = self.root / "logs" / f"{name}.openai.log"
            served = ServedRepository.load(server.repo)
            fe = FrontendProcess(served, server.grpc_url, free_port(), "127.0.0.1", log).start()
            self._frontends[name] = fe
            fe.wait_ready()
            fe.log = log
            fe.client = openai.OpenAI(base_url=fe.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        return self._frontends[name]

    def close(self) -> None:
        """Frontends, then every server at once (each takes seconds to unload its models)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, len(self._frontends), len(self.servers))) as pool:
            list(pool.map(lambda fe: fe.stop(), self._frontends.values()))
            list(pool.map(lambda server: server.stop(), self.servers.values()))


# -- a server of a test's own: `trt-spec serve` as a user runs it ---------------------------------------------------

SHM = Path("/dev/shm")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def argv_of(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def refused(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


class ServeProcess:
    """`python -m trt_spec.cli serve REPO …` with its own TMPDIR; procs() are the server's processes (tritonserver and
    python-backend stubs: every live process whose command line names this repository, launcher aside). With
    openai=True it also gets --openai-port and an openai SDK client."""

    def __init__(self, repo: Path, tmp: Path, *extra: str, openai: bool = False, env: Optional[dict] = None):
        from trt_spec.serve.server import free_port

        self.repo = repo.resolve()
        self.tmpdir = tmp / "tmp"
        self.tmpdir.mkdir(parents=True)
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.openai_port = free_port() if openai else None
        self.out, self.err = tmp / "serve.out", tmp / "serve.err"
        ports = {"http": self.http, "grpc": self.grpc, "metrics": self.metrics, "openai": self.openai_port}
        cmd = [sys.executable, "-m", "trt_spec.cli", "serve", str(self.repo)]
        cmd += [f"--{name}-port={port}" for name, port in ports.items() if port is not None]
        cmd += list(extra)
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, cwd=ROOT, env={**(env or os.environ), "TMPDIR": str(self.tmpdir)}
            )
        if openai:
            import openai as sdk

            self.url = f"http://127.0.0.1:{self.openai_port}"
            self.client = sdk.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def stderr(self) -> str:
        return self.err.read_text()

    def stdout(self) -> str:
        return self.out.read_text()

    def procs(self) -> dict[int, list[str]]:
        out = {}
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and int(p.name) != self.proc.pid and alive(int(p.name)):
                argv = argv_of(int(p.name))
                if any(str(self.repo) in a for a in argv[1:]):
                    out[int(p.name)] = argv
        return out

    def wait_ready(self, timeout: float = 180) -> "ServeProcess":
        """Triton's HTTP readiness, and with openai the ready line that names the OpenAI endpoint."""
        import pytest

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}:\n{self.stderr()}"
            if self.openai_port is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as r:
                        if r.status == 200:
                            return self
                except (urllib.error.URLError, OSError):
                    pass
            elif "OpenAI" in self.stdout():
                return self
            time.sleep(0.25)
        pytest.fail(f"not ready after {timeout}s:\n{self.stderr()}")

    def stubs(self) -> dict[int, list[str]]:
        return {pid: a for pid, a in self.procs().items() if a[0].endswith("triton_python_backend_stub")}

    def shm_prefix(self) -> str:
        for argv in self.procs().values():
            for a in argv:
                m = re.search(r"shm-region-prefix-name=(\S+)", a)
                if m:
                    return m.group(1)
        raise AssertionError("no tritonserver with a shm-region-prefix-name")

    def wait_gone(self, timeout: float = 20) -> dict[int, list[str]]:
        deadline = time.monotonic() + timeout
        while self.procs() and time.monotonic() < deadline:
            time.sleep(0.25)
        return self.procs()

    def workdirs(self) -> list[Path]:
        return list(self.tmpdir.glob("trt-spec-triton-*"))

    def close(self) -> None:
        """Whatever a failed test left: this launcher and the processes that name this repository."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.procs():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for f in SHM.glob(f"trtspec{self.proc.pid}_*"):
            f.unlink(missing_ok=True)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m trt_spec.cli ARGS` as a user runs it: (returncode, stdout, stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "trt_spec.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


OPENAI_KEY = "sk-trtspec-e2e-4f1c9a7b2d"  # the OpenAI key the keyed e2e tests serve with


def env_without_openai_key() -> dict:
    from trt_spec.records import defaults

    return {k: v for k, v in os.environ.items() if k != defaults.OPENAI_API_KEY_ENV}


def serve_openai(repo: Path, tmp: Path, *extra: str, env: dict):
    """`trt-spec serve REPO --openai-port P ...` until ready: (process, ready line, ports, stderr file)."""
    import pytest

    from trt_spec.serve.server import free_port

    ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
    err_path = tmp / "serve.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trt_spec.cli", "serve", str(repo)]
            + [f"--{name}-port={port}" for name, port in ports.items()]
            + list(extra),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
            env=env,
        )
    line = proc.stdout.readline()
    if "OpenAI" not in line:
        proc.kill()
        pytest.fail(f"serve did not come up: {line!r} {err_path.read_text()[-2000:]}")
    return proc, line, ports, err_path


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C: serve drains and stops; killed after 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli_in_process(*args: str) -> CliResult:
    """`trt-spec ARGS` run in this process (click's runner): the same command as the console script, without a new
    interpreter importing torch again for each call (`cli` runs the real subprocess). An exception the CLI does not
    turn into its one-line error lands in stderr as its traceback, as it would on a terminal; torch's thread count
    (bench in-process --threads) is restored after."""
    import traceback

    import torch
    from click.testing import CliRunner

    from trt_spec.cli import main

    threads = torch.get_num_threads()
    try:
        r = CliRunner().invoke(main, list(args), catch_exceptions=True)
    finally:
        torch.set_num_threads(threads)
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        err += "".join(traceback.format_exception(r.exception))
    return CliResult(r.exit_code, r.stdout, err)
