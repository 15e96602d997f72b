"""Runner with stand-in TensorRT-LLM tools (test doubles of the external executables, not of trt-spec)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trt_spec.builder.hardware import resolve_gpu
from trt_spec.builder.plan import make_plan
from trt_spec.builder.preflight import run_preflight
from trt_spec.builder.runner import BuildError, BuildLockedError, run_plan
from trt_spec.records.config import load_config
from trt_spec.records.deployment import WorldSize
from trt_spec.records.manifest import BuildManifest

from ..conftest import tool_calls


def plan_for(path: Path, sets=()):
    cfg = load_config(path, sets)
    return make_plan(cfg, run_preflight(cfg, resolve_gpu(cfg.gpu), require_checkpoints=True), path)


def test_full_build_writes_engines_and_manifest(fake_build):
    p = plan_for(fake_build["config"])
    res = run_plan(p, config_path=fake_build["config"])
    assert [s.status for s in res.steps] == ["ran"] * 4
    calls = tool_calls(fake_build["log"])
    assert [c["tool"] for c in calls] == ["quantize", "quantize", "trtllm_build", "trtllm_build"]
    assert res.manifest == fake_build["out"] / "manifest.json"
    m = BuildManifest.read(fake_build["out"])
    assert m.config_hash == p.config_hash and m.engine == "tensorrt" and m.config == p.report.config
    assert m.target.max_draft_len == 4 and m.draft.max_draft_len == 0
    assert m.deployment.placement.world_size == WorldSize(target=1, draft=1, total=2)
    assert m.gpu.name == "h100" and m.deployment.speculation.mode == "draft_target"
    assert "--speculative_decoding_mode" in m.target.argv
    assert m.target.files and m.draft.files  # built: each engine's sums
    assert [s.status for s in m.steps] == ["ran"] * 4
    assert (fake_build["out"] / "logs" / "engine-target.log").read_text().startswith("$ ")
    # the tools wrote into temporaries that were renamed: no leftovers next to the outputs
    leftovers = [p for p in fake_build["out"].rglob(".*") if "partial" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_second_run_skips_everything_and_a_change_reruns_downstream(fake_build):
    run_plan(plan_for(fake_build["config"]))
    n = len(tool_calls(fake_build["log"]))
    res = run_plan(plan_for(fake_build["config"]))
    assert [s.status for s in res.steps] == ["skipped"] * 4
    assert len(tool_calls(fake_build["log"])) == n
    # changing the target's max_draft_len changes only the target engine's argv
    res = run_plan(plan_for(fake_build["config"], ["speculative.max_draft_len=6"]))
    assert [s.status for s in res.steps] == ["skipped", "skipped", "skipped", "ran"]
    # touching the draft checkpoint invalidates the draft chain (checkpoint + engine)
    cfgj = Path(load_config(fake_build["config"]).draft.checkpoint) / "config.json"
    cfgj.write_text(cfgj.read_text() + " ")
    res = run_plan(plan_for(fake_build["config"], ["speculative.max_draft_len=6"]))
    assert [s.status for s in res.steps] == ["skipped", "ran", "ran", "skipped"]


def test_failed_step_keeps_no_output_and_rerun_resumes(fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "engines/.target.partial")
    with pytest.raises(BuildError) as e:
        run_plan(plan_for(fake_build["config"]), config_path=fake_build["config"])
    err = e.value
    assert err.step == "engine-target" and "exit code 3" in str(err)
    assert "out of memory" in err.tail
    assert err.rerun == f"trt-spec build {fake_build['config']} --only engine-target"
    assert not (fake_build["out"] / "engines" / "target").exists()
    assert not list((fake_build["out"] / "engines").glob(".target.partial-*"))
    assert not (fake_build["out"] / "manifest.json").exists()
    monkeypatch.delenv("FAKE_FAIL")
    res = run_plan(plan_for(fake_build["config"]))
    assert [s.status for s in res.steps] == ["skipped", "skipped", "skipped", "ran"]
    assert (fake_build["out"] / "manifest.json").is_file()


def test_only_runs_one_step_and_needs_its_inputs(fake_build):
    p = plan_for(fake_build["config"])
    with pytest.raises(BuildError, match="--only engine-target needs the output of checkpoint-target"):
        run_plan(p, only="engine-target")
    with pytest.raises(BuildError, match="no such step; steps are checkpoint-target"):
        run_plan(p, only="nope")
    res = run_plan(p, only="checkpoint-target")
    assert [(s.name, s.status) for s in res.steps] == [("checkpoint-target", "ran")]
    assert res.manifest is None


def test_dry_run_runs_nothing(fake_build):
    res = run_plan(plan_for(fake_build["config"]), dry_run=True)
    assert {s.status for s in res.steps} == {"would-run"}
    assert tool_calls(fake_build["log"]) == [] and not fake_build["out"].exists()


def test_kill_mid_step_leaves_no_half_written_output(fake_build):
    """SIGKILL the whole build during a step: the final path never holds partial output; rerun completes."""
    mark = fake_build["tmp"] / "sleeping"
    env = {**os.environ, "FAKE_SLEEP": "30", "FAKE_SLEEP_MARK": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trt_spec.cli", "build", str(fake_build["config"])],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 30
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "the stand-in tool never started"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = fake_build["out"] / "checkpoints" / "target"
    assert not ckpt.exists()  # only a hidden temporary may remain
    assert list(ckpt.parent.glob(".target.partial-*"))
    res = run_plan(plan_for(fake_build["config"]))
    assert [s.status for s in res.steps] == ["ran"] * 4
    assert not list(ckpt.parent.glob(".target.partial-*"))


def _tool_pids(tools_dir: Path) -> set[int]:
    """Live (not zombie) processes running one of the stand-in tools under tools_dir."""
    pids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(tools_dir) in cmd and state != "Z":
            pids.add(int(d.name))
    return pids


def _start_sleeping_build(fake_build, **popen) -> subprocess.Popen:
    mark = fake_build["tmp"] / "sleeping"
    env = {**os.environ, "FAKE_SLEEP": "30", "FAKE_SLEEP_MARK": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trt_spec.cli", "build", str(fake_build["config"])], env=env, **popen
    )
    deadline = time.time() + 30
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "the stand-in tool never started"
    return proc


def _gone_within(tools_dir: Path, seconds: float) -> set[int]:
    deadline = time.time() + seconds
    while (left := _tool_pids(tools_dir)) and time.time() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_kill_9_of_the_build_alone_takes_the_tool_with_it(fake_build):
    """SIGKILL only the build process (not its group): its step tool must not keep running and writing."""
    tools = fake_build["tmp"] / "tools"
    proc = _start_sleeping_build(fake_build, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _tool_pids(tools), "the stand-in tool is not running"
        proc.kill()
        proc.wait()
        left = _gone_within(tools, 5)
        assert not left, f"step tool(s) {sorted(left)} outlived the killed build"
    finally:
        for pid in _tool_pids(tools):
            os.kill(pid, signal.SIGKILL)
    res = run_plan(plan_for(fake_build["config"]))
    assert [s.status for s in res.steps] == ["ran"] * 4


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the tool through /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_the_tool_and_clean_up(fake_build, sig):
    tools = fake_build["tmp"] / "tools"
    proc = _start_sleeping_build(fake_build, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "rerun the same command to resume" in err
        assert not _gone_within(tools, 5)
    finally:
        for pid in _tool_pids(tools):
            os.kill(pid, signal.SIGKILL)
    ckpt = fake_build["out"] / "checkpoints"
    assert not list(ckpt.glob(".*partial*")) and not (ckpt / "target").exists()


def test_ctrl_c_cleans_up(fake_build):
    mark = fake_build["tmp"] / "sleeping"
    env = {**os.environ, "FAKE_SLEEP": "30", "FAKE_SLEEP_MARK": str(mark)}
    # A user's Ctrl-C reaches a foreground process whose SIGINT is at its default; a test run started as a background
    # job of a non-interactive shell inherits SIGINT ignored (bash does that to `cmd &`), so restore the default
    proc = subprocess.Popen(
        [sys.executable, "-m", "trt_spec.cli", "build", str(fake_build["config"])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 30
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "rerun the same command to resume" in err
    ckpt = fake_build["out"] / "checkpoints"
    assert not list(ckpt.glob(".*partial*")) and not (ckpt / "target").exists()


def test_lock_refuses_concurrent_build(fake_build):
    out = fake_build["out"]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path; from trt_spec.builder.runner import _Lock\n"
                f"l = _Lock(Path({str(out)!r})); l.__enter__(); print('locked', flush=True); time.sleep(30)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(BuildLockedError, match=rf"another trt-spec build of .* is running \(pid {holder.pid}\)"):
            run_plan(plan_for(fake_build["config"]))
    finally:
        holder.kill()
        holder.wait()
    # the OS released the lock with the process: the build proceeds
    assert [s.status for s in run_plan(plan_for(fake_build["config"])).steps] == ["ran"] * 4


def test_missing_tool_is_one_clear_error(fake_build):
    p = plan_for(fake_build["config"], ["toolchain.trtllm_build=/nonexistent/trtllm-build"])
    with pytest.raises(BuildError, match="cannot start /nonexistent/trtllm-build.*trt-spec doctor"):
        run_plan(p)


def test_another_tensorrt_llm_stops_the_build_before_any_step(fake_build, monkeypatch):
    from trt_spec.builder import trtllm

    monkeypatch.setattr(trtllm, "dist_version", lambda d: "1.1.0" if d == "tensorrt_llm" else None)
    with pytest.raises(BuildError, match=r"TensorRT-LLM 1.1.0 is installed, but trt-spec targets 1.2.1 .*26.04"):
        run_plan(plan_for(fake_build["config"]), config_path=fake_build["config"])
    assert tool_calls(fake_build["log"]) == [] and not (fake_build["out"] / "manifest.json").exists()
