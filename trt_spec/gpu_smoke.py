"""`make gpu-smoke` / `trt-spec smoke`: the whole GPU chain on one small model, in minutes, with one diagnosis report.

Two chains over SmolLM2-135M (build_configs/smollm2-first-contact-*.yaml), after `trt-spec doctor`:
- engine: plan -> every build step (import, distill, ModelOpt FP8 quantize.py, trtllm-build; one link each) ->
  repo -> serve to READY -> NVIDIA's end_to_end_grpc_client.py (ensemble, then tensorrt_llm_bls) -> check -> bench;
- llmapi: the runtime: llmapi twin over the same imported / distilled checkpoints: plan -> build steps -> repo ->
  serve -> check -> bench (NVIDIA's end_to_end client names only ensemble / tensorrt_llm_bls, which an LLM-API
  repository does not have).
Every link is a command (the CLI as a user types it, the image's python3); its output goes to LOG_DIR/CHAIN-LINK.log.
A chain stops at its first failure; the report (report.json + report.md) says, per link, ok, or failed with the lines
of its logs that matter (the last error-looking lines; the build step's own log and the server's log included), or
not run. A failed doctor runs no chain. Nothing here needs a GPU itself: tests run it against stand-in commands.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .records.procutil import stop_group

ENGINE_CONFIG = "build_configs/smollm2-first-contact-fp8.yaml"
LLMAPI_CONFIG = "build_configs/smollm2-first-contact-llmapi.yaml"
OUT_DIR = "build/gpu-smoke"
# NVIDIA's client in the 26.04 image: tensorrtllm_backend r26.04 dockerfile/Dockerfile.triton.trt_llm_backend
# (WORKDIR /app; COPY .../triton_backend/inflight_batcher_llm/client client)
NVIDIA_CLIENT = "/app/client/end_to_end_grpc_client.py"
CLIENT_PROMPT = "The capital of France is"
# end_to_end_grpc_client.py prints a server error and still exits 0 (run_inference: "Received an error from server:")
CLIENT_FAILURE = ("Received an error from server", "Traceback")
EXCERPT_LINES = 12
# error-looking: words, TensorRT / TensorRT-LLM's "[E]" lines, Triton's glog "E1202 ..." lines
ERROR_LOOKING = re.compile(
    r"\[E\]|^E\d{4} |error|exception|traceback|fail|fatal|assert|refus|cannot|can't|unable|not found|no such|out of memory|"
    r"\boom\b|killed|denied|invalid|unsupported|what\(\)|core dumped|segmentation|timed out|timeout", re.I)
READY_LINE = re.compile(r"^ready: ", re.M)  # what `trt-spec serve` prints once every model is READY



def configured_calib_dataset(config: str) -> Optional[str]:
    """The engine config's quantization.calib_dataset (the first-contact config names trt-spec's bundled set,
    build/calibration.py BUNDLED_CALIB_DATASET), or None: then quantize.py would download cnn_dailymail."""
    from .records.config import ConfigError, load_config

    try:
        return load_config(config).quantization.calib_dataset
    except ConfigError:
        return None  # the plan link says what is wrong with the config


@dataclass
class Link:
    """One command of a chain. background: started and left running (the server) once `ready` is seen in its output;
    stopped when the chain ends."""

    name: str
    argv: list[str]
    timeout_s: float = 1800.0
    env: dict[str, str] = field(default_factory=dict)
    logs: tuple[str, ...] = ()  # other logs that matter: a build step's own log, the server's log
    background: bool = False
    ready: re.Pattern = READY_LINE
    failure_text: tuple[str, ...] = ()  # output that means failure even with exit code 0
    parse: Optional[Callable[[str], None]] = None  # reads the output of an ok link (the plan), may raise ValueError


@dataclass
class LinkResult:
    chain: str
    name: str
    status: str  # ok | failed | not run
    seconds: float = 0.0
    command: str = ""
    log: str = ""
    reason: str = ""
    excerpt: list[dict] = field(default_factory=list)  # [{"log": path, "lines": [...]}]


def excerpt(text: str, n: int = EXCERPT_LINES) -> list[str]:
    """The lines of a log that matter: the last n error-looking lines, else its last n lines (the `$ command` line that
    heads a link's and a build step's log is in the report already)."""
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


def _stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to the process group (trt-spec serve drains, then stops tritonserver), SIGKILL after grace_s."""
    stop_group(proc, grace_s)


def run_chain(chain: str, links: list[Link], log_dir: Path, say: Callable[[str], None] = lambda m: None,
              poll_s: float = 0.5) -> list[LinkResult]:
    """Run the links in order; the first failure ends the chain (the rest: not run). Background links stop at the end.
    `links` may grow while it runs (the plan link adds the build steps it reads)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[LinkResult] = []
    running: list[subprocess.Popen] = []
    failed = False
    try:
        i = 0
        while i < len(links):
            link = links[i]
            i += 1
            cmd = shlex.join(link.argv)
            if failed:
                results.append(LinkResult(chain, link.name, "not run", command=cmd))
                continue
            log = log_dir / f"{chain}-{link.name}.log"
            say(f"[{chain}] {link.name}: {cmd}")
            res = _run_link(chain, link, log, cmd, running, poll_s)
            results.append(res)
            say(f"[{chain}] {link.name}: {res.status}" + (f" ({res.reason})" if res.reason else "")
                + f" in {res.seconds:.0f}s")
            failed = res.status != "ok"
    finally:
        for proc in reversed(running):
            _stop(proc)
    return results


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
            proc = subprocess.Popen(link.argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **link.env},
                                    start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            f.write(f"cannot start {link.argv[0]}: {e.strerror}\n")
            return fail(f"cannot start {link.argv[0]}: {e.strerror}")
    if link.background:
        running.append(proc)
        while True:
            if link.ready.search(log.read_text(errors="replace")):
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
        if rc != 0:
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
    out_dir: str = OUT_DIR
    gpu: str = "auto"  # --gpu for plan/build: auto = nvidia-smi
    trt_spec: tuple[str, ...] = (sys.executable, "-m", "trt_spec.cli")  # how the CLI is started
    python: str = sys.executable  # runs NVIDIA's client
    nvidia_client: str = NVIDIA_CLIENT
    calib_dataset: Optional[str] = None  # a local set instead of the engine config's (--set quantization.calib_dataset)
    build_timeout_s: float = 1800.0
    ready_timeout_s: float = 900.0
    client_timeout_s: float = 300.0
    bench_timeout_s: float = 900.0
    ports: Optional[tuple[int, int, int]] = None  # http, grpc, metrics (None: free ports)


def _ports(s: SmokeSettings) -> tuple[int, int, int]:
    if s.ports:
        return s.ports
    from .serve.server import free_port

    return free_port(), free_port(), free_port()


def chain_links(kind: str, s: SmokeSettings, calib: Optional[str]) -> list[Link]:
    """The links of one chain (kind engine | llmapi). The plan link reads `trt-spec plan --format json` and inserts
    one build link per step (`trt-spec build CONFIG --only STEP`: the step's own log is build/NAME/logs/STEP.log)."""
    config = s.engine_config if kind == "engine" else s.llmapi_config
    out = Path(s.out_dir) / kind
    cli = list(s.trt_spec)
    sets = ["--gpu", s.gpu] + (["--set", f"quantization.calib_dataset={calib}"] if calib and kind == "engine"
                               else [])
    http, grpc, metrics = _ports(s)
    url = f"127.0.0.1:{grpc}"
    repo = out / "repo"
    server_log = out / "tritonserver.log"
    out.mkdir(parents=True, exist_ok=True)
    links: list[Link] = []
    found: dict = {}

    def read_plan(stdout: str) -> None:
        start = next((m.start() for m in re.finditer(r"^\{", stdout, re.M)), None)
        try:
            plan = json.JSONDecoder().raw_decode(stdout[start:])[0] if start is not None else None
        except ValueError:
            plan = None
        if not isinstance(plan, dict) or "output_dir" not in plan:
            raise ValueError("trt-spec plan --format json printed no plan")
        build_dir = Path(plan["output_dir"])
        found["build_dir"] = build_dir
        steps = plan.get("steps") or []
        imported = next((st["output"] for st in steps if st["name"] == "import-target"), None)
        found["tokenizer"] = str(Path(imported).resolve()) if imported else plan["engines"].get("target", "")
        at = links.index(plan_link) + 1
        builds = [Link(f"build:{st['name']}", cli + ["build", config, *sets, "--only", st["name"]],
                       s.build_timeout_s, logs=(str(build_dir / "logs" / f"{st['name']}.log"),)) for st in steps]
        # the manifest (a runtime: llmapi plan may have no step at all; an up-to-date build just writes it)
        builds.append(Link("build:manifest", cli + ["build", config, *sets], s.build_timeout_s))
        links[at:at] = builds
        tail = links[at + len(builds):]
        for link in tail:  # now that the build directory and the tokenizer are known
            link.argv = [a.replace("{BUILD_DIR}", str(build_dir)).replace("{TOKENIZER}", found["tokenizer"])
                         for a in link.argv]

    plan_link = Link("plan", cli + ["plan", config, *sets, "--format", "json"], 300.0, parse=read_plan)
    links.append(plan_link)
    links.append(Link("repo", cli + ["repo", "{BUILD_DIR}", "--out", str(repo)], 300.0))
    links.append(Link("serve", cli + ["serve", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
                                      "--metrics-port", str(metrics), "--timeout", str(int(s.ready_timeout_s)),
                                      "--log", str(server_log)],
                      s.ready_timeout_s + 60, logs=(str(server_log),), background=True))
    if kind == "engine":
        for model in ("ensemble", "tensorrt_llm_bls"):
            links.append(Link(f"nvidia-client:{model}",
                              [s.python, s.nvidia_client, "-u", url, "-p", CLIENT_PROMPT, "-o", "16",
                               "--model-name", model], s.client_timeout_s, logs=(str(server_log),),
                              failure_text=CLIENT_FAILURE))
    links.append(Link("check", cli + ["check", "--url", url, "--tokenizer", "{TOKENIZER}", "--limit", "2",
                                      "--max-tokens", "32", "--wait", "60"], s.client_timeout_s,
                      logs=(str(server_log),)))
    links.append(Link("bench", cli + ["bench", "--url", url, "--tokenizer", "{TOKENIZER}", "--limit", "2",
                                      "--max-tokens", "64", "--out", str(out / "bench")], s.bench_timeout_s,
                      logs=(str(server_log),)))
    return links


@dataclass
class SmokeReport:
    started: str
    finished: str = ""
    calib_dataset: Optional[str] = None
    links: list[LinkResult] = field(default_factory=list)

    def chain_verdict(self, chain: str) -> str:
        rs = [r for r in self.links if r.chain == chain]
        bad = next((r for r in rs if r.status == "failed"), None)
        if bad is not None:
            return f"failed at {bad.name}"
        return "ok" if rs and all(r.status == "ok" for r in rs) else "not run"

    @property
    def chains(self) -> list[str]:
        return list(dict.fromkeys(r.chain for r in self.links))

    @property
    def ok(self) -> bool:
        return bool(self.links) and all(r.status == "ok" for r in self.links)

    def to_json(self) -> dict:
        return {"ok": self.ok, "started": self.started, "finished": self.finished,
                "calib_dataset": self.calib_dataset,
                "chains": {c: self.chain_verdict(c) for c in self.chains},
                "links": [asdict(r) for r in self.links]}

    def to_markdown(self) -> str:
        md = ["# trt-spec GPU smoke", "",
              f"{'**ok**: every link passed' if self.ok else '**failed**'} ({self.started} - {self.finished})", ""]
        md += [f"- {c}: {self.chain_verdict(c)}" for c in self.chains]
        md += ["", "| chain | link | status | seconds | log |", "|---|---|---|---|---|"]
        md += [f"| {r.chain} | {r.name} | {r.status}{' (' + r.reason + ')' if r.reason else ''} | "
               f"{r.seconds:.0f} | {r.log} |" for r in self.links]
        for r in self.links:
            if r.status != "failed":
                continue
            md += ["", f"## {r.chain}: {r.name} failed ({r.reason})", "", f"    $ {r.command}"]
            for ex in r.excerpt:
                md += ["", f"{ex['log']}:", "", "```", *ex["lines"], "```"]
        return "\n".join(md) + "\n"

    def write(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        (out_dir / "report.md").write_text(self.to_markdown())
        return out_dir / "report.md"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_smoke(s: SmokeSettings = SmokeSettings(), say: Callable[[str], None] = lambda m: None) -> SmokeReport:
    """doctor, then the engine chain, then the llmapi chain; writes OUT_DIR/report.{json,md} and returns the report.
    Without a calibration set it refuses before anything runs (quantize.py would download cnn_dailymail)."""
    configured = configured_calib_dataset(s.engine_config)
    rep = SmokeReport(_now(), calib_dataset=s.calib_dataset or configured)
    out, logs = Path(s.out_dir), Path(s.out_dir) / "logs"
    if not rep.calib_dataset:
        rep.links.append(LinkResult("host", "calibration set", "failed", reason=(
            f"{s.engine_config} names no quantization.calib_dataset and quantize.py would download cnn_dailymail; "
            "give a local one: trt-spec smoke --calib-dataset DIR (a datasets directory with a text column)")))
    else:
        rep.links += run_chain("host", [Link("doctor", list(s.trt_spec) + ["doctor"], 300.0)], logs, say)
    host_ok = all(r.status == "ok" for r in rep.links)
    for kind in ("engine", "llmapi"):
        links = chain_links(kind, s, s.calib_dataset)
        if host_ok:
            rep.links += run_chain(kind, links, logs, say)
        else:
            rep.links += [LinkResult(kind, ln.name, "not run", command=shlex.join(ln.argv)) for ln in links]
    rep.finished = _now()
    rep.write(out)
    return rep
