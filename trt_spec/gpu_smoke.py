"""`make gpu-smoke` / `trt-spec smoke`: the whole GPU chain on SmolLM2-135M and the kernel twin, one diagnosis report.

After `trt-spec doctor`, two chains (engine, llmapi) run plan -> build steps -> repo -> plain launch + a request ->
serve -> NVIDIA's clients (engine path) -> check -> bench, one command per link, logged to LOG_DIR/CHAIN-LINK.log.
Then the kernel twin (a tiny random Llama of the 70B's attention shape, written first) on the engine path: `twin` on
one GPU, `twin-tp2` (TP2 target, TP1 draft, orchestrator repository; no bench) with 2+ GPUs, else skipped with why.
A chain stops at its first failure; report.{json,md} gives each link's status and log excerpts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .records.atomic import write_atomic

ENGINE_CONFIG = "build_configs/smollm2-first-contact-fp8.yaml"
LLMAPI_CONFIG = "build_configs/smollm2-first-contact-llmapi.yaml"
TWIN_CONFIG = "build_configs/kernel-twin-llama70b-shape.yaml"  # the 70B's attention shape (reference/kernel_twin.py)
TWIN_TP2_CONFIG = "build_configs/kernel-twin-llama70b-shape-tp2.yaml"
TWIN_CHAINS = ("twin", "twin-tp2")  # engine-path chains on the kernel twin, which trt-spec writes first
OUT_DIR = "build/gpu-smoke"
# (upstream-facts: e2e-client-image-path)
NVIDIA_CLIENT = "/app/client/end_to_end_grpc_client.py"
CLIENT_PROMPT = "The capital of France is"
# the client exits 0 on a server error (upstream-facts: e2e-client-exit-zero-on-error)
CLIENT_FAILURE = ("Received an error from server", "Traceback")
LLMAPI_MODEL = "tensorrt_llm"  # records.llmapi_contract.MODEL_NAME
GENERATE_FAILURE = ('"error"',)  # (upstream-facts: generate-stream-late-error-200)
EXCERPT_LINES = 12
# words, TensorRT's "[E]" lines, Triton's glog "E1202 ..." lines
ERROR_LOOKING = re.compile(
    r"\[E\]|^E\d{4} |error|exception|traceback|fail|fatal|assert|refus|cannot|can't|unable|not found|no such|"
    r"out of memory|\boom\b|killed|denied|invalid|unsupported|what\(\)|core dumped|segmentation|timed out|timeout",
    re.I,
)
READY_LINE = re.compile(r"^ready: ", re.M)  # `trt-spec serve` prints this once every model is READY
PLAIN_LINE = re.compile(r"^or start tritonserver yourself, from any directory: (.+)$", re.M)
# not the checkout: a path the backend resolves against the cwd (gpt_model_path) must fail as it would for a user
PLAIN_CWD = tempfile.gettempdir()
DOCTOR_TIMEOUT_S = 900.0  # doctor imports tensorrt_llm in subprocesses and runs pip check
READY_MARGIN_S = 120.0  # over serve's ready timeout, so serve fails first, with its reason


def configured_calib_dataset(config: str) -> Optional[str]:
    """The engine config's quantization.calib_dataset, or None (upstream-facts: quantize-py-default-calib)."""
    from .records.config import ConfigError, load_config

    try:
        return load_config(config).quantization.calib_dataset
    except ConfigError:
        return None  # the plan link reports the config error


@dataclass
class Link:
    """One command of a chain; a background link keeps running once ready and stops when the chain ends."""

    name: str
    argv: list[str]
    timeout_s: float = 1800.0
    env: dict[str, str] = field(default_factory=dict)
    logs: tuple[str, ...] = ()  # other logs to excerpt on failure
    background: bool = False
    ready: re.Pattern = READY_LINE
    failure_text: tuple[str, ...] = ()  # output that means failure even with exit code 0
    parse: Optional[Callable[[str], None]] = None  # may raise ValueError
    probe: Optional[Callable[[], bool]] = None  # replaces `ready` when set
    stops: str = ""  # not a command: stop this background link's process group
    ok_codes: tuple[int, ...] = (0,)  # exit codes that pass (check's 3: divergences it could not verify)


@dataclass
class LinkResult:
    chain: str
    name: str
    status: str  # ok | failed | not run | skipped (this host cannot run it: the reason says why)
    seconds: float = 0.0
    command: str = ""
    log: str = ""
    reason: str = ""
    excerpt: list[dict] = field(default_factory=list)  # [{"log": path, "lines": [...]}]


def excerpt(text: str, n: int = EXCERPT_LINES) -> list[str]:
    """The last n error-looking lines of a log, else its last n lines."""
    lines = [ln.rstrip()[:400] for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    hits = [ln for ln in lines if ERROR_LOOKING.search(ln)]
    return (hits or lines)[-n:]


def _excerpts(paths: list[str], n: int = EXCERPT_LINES) -> list[dict]:
    out = []
    for p in paths:
        try:
            text = Path(p).read_text(errors="replace")
        except OSError:
            continue
        lines = excerpt(text, n)
        if lines:
            out.append({"log": p, "lines": lines})
    return out


def _group_alive(pgid: int) -> bool:
    """Whether a non-zombie process of group pgid runs (an orphan may stay unreaped)."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for d in proc_dir.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _stop(proc: subprocess.Popen, grace_s: float = 60.0) -> bool:
    """SIGTERM the whole group (a shell's tritonserver outlives the shell), SIGKILL after grace_s.

    True when the group ended within grace_s."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        proc.poll()
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return False


def run_chain(
    chain: str, links: list[Link], log_dir: Path, say: Callable[[str], None] = lambda m: None, poll_s: float = 0.5
) -> list[LinkResult]:
    """Run the links in order until the first failure; `links` may grow while it runs (the plan link)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[LinkResult] = []
    running: dict[str, subprocess.Popen] = {}
    failed = False
    try:
        i = 0
        while i < len(links):
            link = links[i]
            i += 1
            cmd = f"stop {link.stops} (SIGTERM to its process group)" if link.stops else shlex.join(link.argv)
            if failed:
                results.append(LinkResult(chain, link.name, "not run", command=cmd))
                continue
            log = log_dir / f"{chain}-{link.name}.log"
            say(f"[{chain}] {link.name}: {cmd}")
            if link.stops:
                res = _stop_link(chain, link, log_dir / f"{chain}-{link.stops}.log", cmd, running)
            else:
                res = _run_link(chain, link, log, cmd, running, poll_s)
            results.append(res)
            say(
                f"[{chain}] {link.name}: {res.status}"
                + (f" ({res.reason})" if res.reason else "")
                + f" in {res.seconds:.0f}s"
            )
            failed = res.status != "ok"
    finally:
        for proc in reversed(list(running.values())):
            _stop(proc)
    return results


def _stop_link(chain: str, link: Link, server_log: Path, cmd: str, running: dict) -> LinkResult:
    """Ok when the link served until now and its group ended within link.timeout_s of SIGTERM."""
    t0 = time.monotonic()
    res = LinkResult(chain, link.name, "failed", command=cmd, log=str(server_log))
    proc = running.pop(link.stops, None)
    if proc is None:
        res.reason = f"{link.stops} is not running"
    else:
        died = proc.poll()
        if not _stop(proc, link.timeout_s):
            res.reason = f"still running {link.timeout_s:.0f}s after SIGTERM; killed"
        elif died is not None:
            res.reason = f"it had exited with code {died} while serving"
        else:
            res.status = "ok"
    res.seconds = time.monotonic() - t0
    if res.status != "ok":
        res.excerpt = _excerpts([str(server_log), *link.logs])
    return res


def _run_link(chain: str, link: Link, log: Path, cmd: str, running: list, poll_s: float) -> LinkResult:
    t0 = time.monotonic()
    res = LinkResult(chain, link.name, "failed", command=cmd, log=str(log))

    def fail(reason: str) -> LinkResult:
        res.reason, res.seconds = reason, time.monotonic() - t0
        res.excerpt = _excerpts([str(log), *link.logs])
        return res

    with open(log, "w") as f:
        f.write(f"$ {cmd}\n")
        f.flush()
        try:
            proc = subprocess.Popen(
                link.argv,
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, **link.env},
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        except OSError as e:
            f.write(f"cannot start {link.argv[0]}: {e.strerror}\n")
            return fail(f"cannot start {link.argv[0]}: {e.strerror}")
    if link.background:
        running[link.name] = proc
        while True:
            if link.probe() if link.probe is not None else link.ready.search(log.read_text(errors="replace")):
                break
            if proc.poll() is not None:
                return fail(f"exited with code {proc.returncode} before it was ready")
            if time.monotonic() - t0 > link.timeout_s:
                return fail(f"not ready after {link.timeout_s:.0f}s")
            time.sleep(poll_s)
    else:
        try:
            rc = proc.wait(timeout=link.timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc, grace_s=10)
            return fail(f"timed out after {link.timeout_s:.0f}s")
        if rc not in link.ok_codes:
            return fail(f"exit code {rc}")
        text = log.read_text(errors="replace")
        bad = next((t for t in link.failure_text if t in text), None)
        if bad is not None:
            return fail(f"exit code 0, but its output says {bad!r}")
        if link.parse is not None:
            try:
                link.parse(text.split("\n", 1)[1] if "\n" in text else "")
            except ValueError as e:
                return fail(str(e))
    res.status, res.seconds = "ok", time.monotonic() - t0
    return res


# ------------------------------------------------------------------------------------------------------------ chains


@dataclass
class SmokeSettings:
    engine_config: str = ENGINE_CONFIG
    llmapi_config: str = LLMAPI_CONFIG
    twin_config: str = TWIN_CONFIG
    twin_tp2_config: str = TWIN_TP2_CONFIG
    twin_writer: tuple[str, ...] = (sys.executable, "-m", "trt_spec.reference.kernel_twin")
    out_dir: str = OUT_DIR
    gpu: str = "auto"
    trt_spec: tuple[str, ...] = (sys.executable, "-m", "trt_spec.cli")
    python: str = sys.executable  # runs NVIDIA's client
    nvidia_client: str = NVIDIA_CLIENT
    curl: str = "curl"
    plain_cwd: str = PLAIN_CWD
    calib_dataset: Optional[str] = None  # overrides the engine config's
    build_timeout_s: float = 1800.0
    ready_timeout_s: Optional[float] = None  # None: serve's own default
    stop_timeout_s: float = 120.0
    client_timeout_s: float = 300.0
    bench_timeout_s: float = 900.0
    ports: Optional[tuple[int, int, int]] = None  # http, grpc, metrics; None: free ports


def _ports(s: SmokeSettings) -> tuple[int, int, int]:
    if s.ports:
        return s.ports
    from .serve.server import free_port

    return free_port(), free_port(), free_port()


def gpu_count(gpu: str) -> int:
    """GPUs of --gpu NAME:COUNT, or nvidia-smi's count for auto (0 when it finds none)."""
    name, _, count = gpu.partition(":")
    if name.strip().lower() != "auto":
        return int(count) if count.strip().isdigit() else 1
    from .builder.hardware import detect_gpus

    found = detect_gpus()
    return found.count if found else 0


def chain_links(kind: str, s: SmokeSettings, calib: Optional[str]) -> list[Link]:
    """The links of one chain (kind engine | llmapi | twin | twin-tp2)."""
    return _ChainLinks(kind, s, calib).links()


def first_json(text: str) -> Optional[dict]:
    """The JSON object on the first line that starts with `{`, or None."""
    start = next((m.start() for m in re.finditer(r"^\{", text, re.M)), None)
    try:
        found = json.JSONDecoder().raw_decode(text[start:])[0] if start is not None else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _read_plan_json(stdout: str) -> dict:
    plan = first_json(stdout)
    if plan is None or "output_dir" not in plan:
        raise ValueError("trt-spec plan --format json printed no plan")
    return plan


def check_facts(report: dict) -> dict:
    """What the smoke keeps of `check --format json`: the verdict and the margin it measured (reuse it on this
    host's big deployments: check --margin FILE)."""
    keys = ("verdict", "unverified", "near_ties", "real_mismatches", "measured_margin", "near_tie_margin")
    out = {f"check_{k}": report.get(k) for k in keys}
    out["check_noise_floor"] = (report.get("noise_floor") or {}).get("max")
    out["check_margin_source"] = report.get("margin_source")
    return out


def quantize_peaks(build_dir: Path, estimates: dict) -> dict:
    """Per quantized role, the peak quantize.py measured (builder/quantize_peak.py) beside preflight's estimate."""
    from .builder.quantize_peak import PEAK_SUFFIX

    out = {}
    for role, est in sorted(estimates.items()):
        f = build_dir / "logs" / f"checkpoint-{role}{PEAK_SUFFIX}"
        try:
            measured = json.loads(f.read_text()).get("max_memory_allocated_gib")
        except (OSError, ValueError):
            measured = None  # the step did not run (or was up to date)
        out[f"quantize_peak_{role}_gib"] = {"measured": measured, **est}
    return out


class _ChainLinks:
    """One chain's links; the plan and repo links fill in the links after them from their output."""

    def __init__(self, kind: str, s: SmokeSettings, calib: Optional[str]) -> None:
        self.kind, self.s = kind, s
        configs = {"engine": s.engine_config, "llmapi": s.llmapi_config, "twin": s.twin_config}
        self.config = configs.get(kind, s.twin_tp2_config)
        self.out = Path(s.out_dir) / kind
        self.cli = list(s.trt_spec)
        with_calib = calib and kind == "engine"  # the twins calibrate with their own config's bundled set
        self.sets = ["--gpu", s.gpu] + (["--set", f"quantization.calib_dataset={calib}"] if with_calib else [])
        self.http, self.grpc, self.metrics = _ports(s)
        self.url = f"127.0.0.1:{self.grpc}"
        self.repo = self.out / "repo"
        self.server_log = self.out / "tritonserver.log"
        self.chain: list[Link] = []  # read_plan edits it in place while run_chain runs it
        self.build_dir: Optional[Path] = None  # read_plan sets them
        self.calibration_peaks: dict = {}
        self.check_json = Path(s.out_dir) / "logs" / f"{kind}-check.log"  # run_smoke's log_dir
        plan_argv = self.cli + ["plan", self.config, *self.sets, "--format", "json"]
        self.plan_link = Link("plan", plan_argv, 300.0, parse=self.read_plan)
        # Triton prints no line of trt-spec's: ready is /v2/health/ready
        self.plain_link = Link(
            "plain-launch",
            [],
            s.ready_timeout_s or 900.0,
            background=True,
            probe=lambda: http_ready(f"127.0.0.1:{self.http}"),
        )
        self.serve_link = Link(
            "serve",
            self.serve_argv(),
            (s.ready_timeout_s or 900.0) + READY_MARGIN_S,
            logs=(str(self.server_log),),
            background=True,
        )

    def links(self) -> list[Link]:
        """plan -> repo -> plain launch, request, stop -> serve -> served links."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.kind in TWIN_CHAINS:  # its checkpoints first: the plan reads their config.json
            self.chain.append(Link("write-twin", list(self.s.twin_writer), 900.0))
        self.chain += [
            self.plan_link,
            Link("repo", self.cli + ["repo", "{BUILD_DIR}", "--out", str(self.repo)], 300.0, parse=self.read_repo),
            self.plain_link,
            self.plain_request_link(),
            Link("plain-stop", [], self.s.stop_timeout_s, stops="plain-launch"),
            self.serve_link,
            *_served_links(self.kind, self.s, self.url, self.out, self.server_log),
        ]
        return self.chain

    def serve_argv(self) -> list[str]:
        """`trt-spec serve REPO` on this chain's ports."""
        ports = ["--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics)]
        timeout = [] if self.s.ready_timeout_s is None else ["--timeout", str(int(self.s.ready_timeout_s))]
        return self.cli + ["serve", str(self.repo), *ports, *timeout, "--log", str(self.server_log)]

    def plain_request_link(self) -> Link:
        """NVIDIA's client (engine) or the documented generate request (llmapi) to the plain launch."""
        plain_log = str(Path(self.s.out_dir) / "logs" / f"{self.kind}-plain-launch.log")  # run_smoke's log_dir
        if self.kind != "llmapi":
            return Link(
                "plain:nvidia-client:ensemble",
                nvidia_client(self.s, self.url, "ensemble"),
                self.s.client_timeout_s,
                logs=(plain_log,),
                failure_text=CLIENT_FAILURE,
            )
        return Link(
            f"plain:generate:{LLMAPI_MODEL}",
            llmapi_request(self.s, f"127.0.0.1:{self.http}"),
            self.s.client_timeout_s,
            logs=(plain_log,),
            failure_text=GENERATE_FAILURE,
            parse=expect_text_output,
        )

    def read_plan(self, stdout: str) -> None:
        """Insert a build link per step plus the manifest link; fill in {BUILD_DIR} / {TOKENIZER}."""
        plan = _read_plan_json(stdout)
        build_dir = self.build_dir = Path(plan["output_dir"])
        self.calibration_peaks = plan.get("calibration_peaks") or {}
        steps = plan.get("steps") or []
        imported = next((st["output"] for st in steps if st["name"] == "import-target"), None)
        tokenizer = str(Path(imported).resolve()) if imported else plan["engines"].get("target", "")
        if self.kind in TWIN_CHAINS:  # engines hold no tokenizer; the twin's checkpoint does
            from .reference.kernel_twin import OUT_DIR as TWIN_DIR
            from .reference.kernel_twin import TARGET_DIR

            tokenizer = str((Path(TWIN_DIR) / TARGET_DIR).resolve())
        builds = [self.build_link(st["name"], build_dir) for st in steps]
        # an llmapi plan may have no step; an up-to-date build just writes the manifest
        builds.append(Link("build:manifest", self.cli + ["build", self.config, *self.sets], self.s.build_timeout_s))
        at = self.chain.index(self.plan_link) + 1
        self.chain[at:at] = builds
        for link in self.chain[at + len(builds) :]:
            link.argv = [a.replace("{BUILD_DIR}", str(build_dir)).replace("{TOKENIZER}", tokenizer) for a in link.argv]

    def facts(self) -> dict:
        """The check's verdict and margin, and quantize.py's measured peaks, once the chain ran."""
        out = {}
        if self.build_dir is not None and self.calibration_peaks:
            out.update(quantize_peaks(self.build_dir, self.calibration_peaks))
        try:
            report = first_json(self.check_json.read_text(errors="replace"))
        except OSError:
            report = None
        if report is not None and "verdict" in report:
            out.update(check_facts(report))
            clean = self.out / "check.json"  # the report alone, for check --margin FILE on this host
            write_atomic(clean, json.dumps(report, indent=2) + "\n")
            out["check_report"] = str(clean)
        return out

    def build_link(self, step: str, build_dir: Path) -> Link:
        return Link(
            f"build:{step}",
            self.cli + ["build", self.config, *self.sets, "--only", step],
            self.s.build_timeout_s,
            logs=(str(build_dir / "logs" / f"{step}.log"),),
        )

    def read_repo(self, stdout: str) -> None:
        """Set the plain-launch command from `repo`'s output, and both ready timeouts."""
        m = PLAIN_LINE.search(stdout)
        if m is None:
            raise ValueError(
                "trt-spec repo printed no plain launch line ('or start tritonserver yourself, from any "
                "directory: ...'): no tritonserver found?"
            )
        line = with_ports(m.group(1).strip(), self.http, self.grpc, self.metrics)
        self.plain_link.argv = ["bash", "-c", f"cd {shlex.quote(self.s.plain_cwd)} && {line}"]
        wait = self.s.ready_timeout_s or serve_ready_timeout_s(self.repo)
        self.plain_link.timeout_s = wait
        self.serve_link.timeout_s = wait + READY_MARGIN_S


def _served_links(kind: str, s: SmokeSettings, url: str, out: Path, server_log: Path) -> list[Link]:
    """NVIDIA's clients (engine chain), check and bench against `trt-spec serve`."""
    cli, links = list(s.trt_spec), []
    if kind != "llmapi":
        for streaming in (False, True):
            for model in ("ensemble", "tensorrt_llm_bls"):
                name = f"nvidia-client{'-streaming' if streaming else ''}:{model}"
                links.append(
                    Link(
                        name,
                        nvidia_client(s, url, model, streaming),
                        s.client_timeout_s,
                        logs=(str(server_log),),
                        failure_text=CLIENT_FAILURE,
                    )
                )
    links.append(
        Link(
            "check",
            cli
            + [
                "check",
                "--url",
                url,
                "--tokenizer",
                "{TOKENIZER}",
                "--limit",
                "2",
                "--max-tokens",
                "32",
                "--wait",
                "60",
                "--format",
                "json",
            ],
            s.client_timeout_s,
            logs=(str(server_log),),
            ok_codes=(0, 3),  # UNVERIFIED (llmapi: no logits) is reported in the chain's facts, not a stop
        )
    )
    if kind == "twin-tp2":  # its point is the TP2 launch and identity; the TP1 twin benches the same kernels
        return links
    links.append(
        Link(
            "bench",
            cli
            + [
                "bench",
                "served",
                "--url",
                url,
                "--tokenizer",
                "{TOKENIZER}",
                "--limit",
                "2",
                "--max-tokens",
                "64",
                "--out",
                str(out / "bench"),
            ],
            s.bench_timeout_s,
            logs=(str(server_log),),
        )
    )
    return links


def nvidia_client(s: SmokeSettings, url: str, model: str, streaming: bool = False) -> list[str]:
    """NVIDIA's end_to_end_grpc_client.py argv (upstream-facts: e2e-client-perf-metrics)."""
    argv = [s.python, s.nvidia_client, "-u", url, "-p", CLIENT_PROMPT, "-o", "16", "--model-name", model]
    return argv + (["-S", "--return-perf-metrics"] if streaming else [])


def llmapi_request(s: SmokeSettings, http: str) -> list[str]:
    """The documented curl request to the LLM-API model (upstream-facts: llmapi-generate-curl), on generate_stream:
    the model is decoupled and /generate answers exactly one response."""
    body = json.dumps({"text_input": CLIENT_PROMPT, "sampling_param_max_tokens": 16})
    return [
        s.curl,
        "-sS",
        "--fail-with-body",
        "-X",
        "POST",
        f"http://{http}/v2/models/{LLMAPI_MODEL}/generate_stream",
        "-d",
        body,
    ]


def expect_text_output(stdout: str) -> None:
    if '"text_output"' not in stdout:
        raise ValueError("the generate request answered no text_output")


def with_ports(plain: str, http: int, grpc: int, metrics: int) -> str:
    """Add the ports right after the first --model-repository flag (the rank that serves the endpoints)."""
    try:
        words = shlex.split(plain)
    except ValueError as e:
        raise ValueError(f"the plain launch line does not parse as shell: {e}") from None
    repo_flag = next((w for w in words if w.startswith("--model-repository=")), None)
    quoted = shlex.quote(repo_flag) if repo_flag else ""
    if not repo_flag or quoted not in plain:
        raise ValueError(f"the plain launch line names no --model-repository: {plain}")
    return plain.replace(quoted, f"{quoted} --http-port={http} --grpc-port={grpc} --metrics-port={metrics}", 1)


def http_ready(hostport: str) -> bool:
    """Triton's /v2/health/ready answers 200 (every model loaded)."""
    try:
        with urllib.request.urlopen(f"http://{hostport}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def serve_ready_timeout_s(repo: Path) -> float:
    """`trt-spec serve`'s default ready timeout for this repository."""
    from .records.manifest import ManifestError, RepoRecord
    from .serve.launch import ServedRepository

    try:
        record = RepoRecord.read(Path(repo))
    except ManifestError:
        record = None
    return ServedRepository(Path(repo), record).ready_timeout_s()


@dataclass
class SmokeReport:
    started: str
    finished: str = ""
    calib_dataset: Optional[str] = None
    links: list[LinkResult] = field(default_factory=list)
    facts: dict[str, dict] = field(default_factory=dict)  # per chain: measured extras (margins, peak memory, ...)

    def chain_verdict(self, chain: str) -> str:
        rs = [r for r in self.links if r.chain == chain]
        bad = next((r for r in rs if r.status == "failed"), None)
        if bad is not None:
            return f"failed at {bad.name}"
        skipped = next((r for r in rs if r.status == "skipped"), None)
        if skipped is not None:
            return f"skipped ({skipped.reason})"
        return "ok" if rs and all(r.status == "ok" for r in rs) else "not run"

    @property
    def chains(self) -> list[str]:
        return list(dict.fromkeys(r.chain for r in self.links))

    @property
    def ok(self) -> bool:
        return any(r.status == "ok" for r in self.links) and all(r.status in ("ok", "skipped") for r in self.links)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "started": self.started,
            "finished": self.finished,
            "calib_dataset": self.calib_dataset,
            "chains": {c: self.chain_verdict(c) for c in self.chains},
            "facts": self.facts,
            "links": [asdict(r) for r in self.links],
        }

    def to_markdown(self) -> str:
        md = [
            "# trt-spec GPU smoke",
            "",
            f"{'**ok**: every link passed' if self.ok else '**failed**'} ({self.started} - {self.finished})",
            "",
        ]
        md += [
            f"- {c}: {self.chain_verdict(c)}" + "".join(f"; {k}: {v}" for k, v in self.facts.get(c, {}).items())
            for c in self.chains
        ]
        md += ["", "| chain | link | status | seconds | log |", "|---|---|---|---|---|"]
        md += [
            f"| {r.chain} | {r.name} | {r.status}{' (' + r.reason + ')' if r.reason else ''} | "
            f"{r.seconds:.0f} | {r.log} |"
            for r in self.links
        ]
        for r in self.links:
            if r.status != "failed":
                continue
            md += ["", f"## {r.chain}: {r.name} failed ({r.reason})", "", f"    $ {r.command}"]
            for ex in r.excerpt:
                md += ["", f"{ex['log']}:", "", "```", *ex["lines"], "```"]
        return "\n".join(md) + "\n"

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / "report.json", json.dumps(self.to_json(), indent=2) + "\n")
        write_atomic(out_dir / "report.md", self.to_markdown())
        return out_dir / "report.md"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_smoke(s: SmokeSettings = SmokeSettings(), say: Callable[[str], None] = lambda m: None) -> SmokeReport:
    """doctor, then the engine and llmapi chains; writes OUT_DIR/report.{json,md}.

    Without a calibration set nothing runs (upstream-facts: quantize-py-default-calib)."""
    configured = configured_calib_dataset(s.engine_config)
    rep = SmokeReport(_now(), calib_dataset=s.calib_dataset or configured)
    out, logs = Path(s.out_dir), Path(s.out_dir) / "logs"
    if not rep.calib_dataset:
        rep.links.append(
            LinkResult(
                "host",
                "calibration set",
                "failed",
                reason=(
                    f"{s.engine_config} names no quantization.calib_dataset "
                    "and quantize.py would download cnn_dailymail; "
                    "give a local one: trt-spec smoke --calib-dataset DIR (a datasets directory with a text column)"
                ),
            )
        )
    else:
        rep.links += run_chain("host", [Link("doctor", list(s.trt_spec) + ["doctor"], DOCTOR_TIMEOUT_S)], logs, say)
    host_ok = all(r.status == "ok" for r in rep.links)
    gpus = gpu_count(s.gpu) if host_ok else 0
    for kind in ("engine", "llmapi", *TWIN_CHAINS):
        chain = _ChainLinks(kind, s, s.calib_dataset)
        links = chain.links()
        if host_ok and kind == "twin-tp2" and gpus < 2:
            why = f"TP2 needs 2 GPUs, this host has {gpus} (make gpu-smoke GPU=NAME:2 on a 2-GPU host)"
            rep.links.append(LinkResult(kind, "tp2", "skipped", reason=why))
        elif host_ok:
            rep.links += run_chain(kind, links, logs, say)
            rep.facts[kind] = {**rep.facts.get(kind, {}), **chain.facts()}
        else:
            rep.links += [LinkResult(kind, ln.name, "not run", command=shlex.join(ln.argv)) for ln in links]
    rep.finished = _now()
    rep.write(out)
    return rep
