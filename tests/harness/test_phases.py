"""A baseline loaded for its phase only (harness/phases.py) against doubles: one switch per `bench` / `check` command
whatever it measures, the restore after a failed switch, the same-host lock, and the unchanged interleaved order where
both models are served."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner

from trt_spec import cli
from trt_spec.harness import commands, phases
from trt_spec.harness.client import ClientError, Generation
from trt_spec.records import llmapi_contract as lc
from trt_spec.records.names import BASELINE, SPECULATIVE

SERVED = {BASELINE: lc.BASELINE_MODEL, SPECULATIVE: lc.MODEL_NAME}


class FakeControl:
    """Triton's model-repository API over a set of loaded models; records every load and unload."""

    def __init__(self, client, fail: dict | None = None):
        self.client = client
        self.loaded = {lc.MODEL_NAME}
        self.calls: list[tuple[str, str]] = []
        self.fail = fail or {}  # (op, name) -> exception to raise

    def _op(self, op: str, name: str) -> None:
        self.calls.append((op, name))
        if (op, name) in self.fail:
            raise self.fail[(op, name)]
        (self.loaded.add if op == "load" else self.loaded.discard)(name)

    def load(self, name):
        self._op("load", name)

    def unload(self, name):
        self._op("unload", name)

    def state(self, name):
        return "READY" if name in self.loaded else "UNAVAILABLE"

    def index(self):
        return [{"name": n, "state": self.state(n)} for n in SERVED.values()]


class FakeClient:
    """Answers a role only while its served model is loaded (as Triton does); records (role, phase) per request."""

    def __init__(self, phased: bool, url: str = "127.0.0.1:9"):
        self.url, self.protocol, self.phased = url, "grpc", phased
        self.ctl = FakeControl(self)
        self.requests: list[str] = []
        self.lock = threading.Lock()

    def generate(self, model, prompt, max_tokens, **params):
        if self.phased and SERVED[model] not in self.ctl.loaded:
            raise ClientError(f"model {SERVED[model]!r} is not loaded")
        with self.lock:
            self.requests.append(model)
        return Generation(
            text="x" * max_tokens, output_ids=list(range(max_tokens)), ttft_s=0.001, latency_s=0.002, chunks=1
        )

    def clone(self):
        return self  # one record of every request, whichever client sent it

    def close(self):
        pass


@pytest.fixture
def served(monkeypatch):
    """`trt-spec bench served/check --url` against a FakeClient (phased or not), its FakeControl the repository API."""
    made = {}

    def make(phased: bool) -> FakeClient:
        fake = made["fake"] = FakeClient(phased)
        monkeypatch.setattr(commands, "served_client", lambda *a, **k: fake)
        monkeypatch.setattr(phases, "require_control", lambda client: fake.ctl)
        return fake

    return make


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


BENCH = [
    "bench",
    "served",
    "--url",
    "127.0.0.1:9",
    "--prompts",
    "code-edit",
    "--limit",
    "2",
    "--max-tokens",
    "4",
    "--concurrency",
    "1",
    "--concurrency",
    "2",
    "--request-rate",
    "100",
    "--format",
    "json",
]
ONE_CYCLE = [
    ("unload", lc.MODEL_NAME),
    ("load", lc.BASELINE_MODEL),
    ("unload", lc.BASELINE_MODEL),
    ("load", lc.MODEL_NAME),
]


def test_one_bench_command_switches_once_for_ab_k_policy_sweep_and_rate(served):
    """Two k x two policies of A/B, a two-level sweep and a request-rate run: ONE phase cycle (it used to be one per
    measurement: 6 here), every speculative workload before the switch, the baseline's A/B measured once for all k
    and policies (it does not depend on them)."""
    fake = served(True)
    r = invoke(*BENCH, "--k", "2", "--k", "4", "--policy", "fixed", "--policy", "adaptive")
    assert r.exit_code == 0, r.output
    assert fake.ctl.calls == ONE_CYCLE
    first_base = fake.requests.index(BASELINE)
    assert set(fake.requests[first_base:]) == {BASELINE}  # paired after, not interleaved
    # speculative: 4 A/Bs x (1 warm-up + 2 prompts), sweep 2 + 2, rate 2; baseline: one A/B (3), sweep 4, rate 2
    assert first_base == 4 * 3 + 4 + 2 and fake.requests.count(BASELINE) == 3 + 4 + 2
    rep = json.loads(r.stdout[r.stdout.index("{") :])
    assert len(rep["bench"]) == 4 and all(b["order"].startswith("phased") for b in rep["bench"])
    assert {(b["k"], b["draft_len_policy"]) for b in rep["bench"]} == {
        (2, "fixed"),
        (4, "fixed"),
        (2, "adaptive"),
        (4, "adaptive"),
    }
    assert all(b["baseline"]["tokens"] == b["speculative"]["tokens"] == 8 for b in rep["bench"])
    assert [row["concurrency"] for row in rep["concurrency"]] == [1, 2] and rep["rate"]["order"].startswith("phased")
    assert fake.ctl.loaded == {lc.MODEL_NAME}


def test_one_check_command_switches_once_for_greedy_and_sampling(served):
    fake = served(True)
    r = invoke(
        "check",
        "--url",
        "127.0.0.1:9",
        "--prompts",
        "code-edit",
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--temperature",
        "0.7",
        "--samples",
        "3",
        "--format",
        "json",
    )
    assert r.exit_code == 0, r.output
    assert fake.ctl.calls == ONE_CYCLE
    assert fake.requests == [SPECULATIVE] * (2 + 2 * 3) + [BASELINE] * (2 + 2 * 3)
    rep = json.loads(r.stdout[r.stdout.index("{") :])
    assert rep["passed"] and rep["order"].startswith("phased") and len(rep["distribution"]) == 2


def test_both_models_served_keeps_the_interleaved_order(served):
    """No switch, and the order of before: A/B alternating per prompt after a paired warm-up, sweep levels in turn
    (which model first alternates by level), the rate run baseline first."""
    fake = served(False)
    r = invoke(*BENCH)
    assert r.exit_code == 0, r.output
    assert fake.ctl.calls == []
    B, S = BASELINE, SPECULATIVE
    assert fake.requests == [
        B,
        S,
        B,
        S,
        B,
        S,
        B,
        S,
        S,
        B,  # A/B: warm-up, prompt 0 (both prefill it, then baseline first), prompt 1 (both prefill, speculative first)
        B,
        B,
        S,
        S,
        S,
        S,
        B,
        B,  # sweep: level 1 baseline first, level 2 speculative first
        B,
        B,
        S,
        S,
    ]  # request rate
    rep = json.loads(r.stdout[r.stdout.index("{") :])
    assert "order" not in rep["bench"][0] and "order" not in rep["rate"]


def test_a_failed_baseline_load_is_the_error_and_the_speculative_model_comes_back(caplog):
    fake = FakeClient(True)
    boom = ClientError("tensorrt_llm_baseline: out of memory")
    fake.ctl.fail = {("load", lc.BASELINE_MODEL): boom}
    with pytest.raises(ClientError) as e:
        with phases.baseline_phase(fake, fake.ctl):
            pytest.fail("the block must not run")
    assert e.value is boom
    # the baseline never loaded: not unloaded; the speculative model is loaded back
    assert fake.ctl.calls == [("unload", lc.MODEL_NAME), ("load", lc.BASELINE_MODEL), ("load", lc.MODEL_NAME)]
    assert fake.ctl.loaded == {lc.MODEL_NAME}


def test_a_restore_that_fails_names_the_state_and_the_fix(caplog):
    fake = FakeClient(True)
    fake.ctl.fail = {
        ("unload", lc.BASELINE_MODEL): ClientError("still READY 900s after unload"),
        ("load", lc.MODEL_NAME): ClientError("out of memory"),
    }
    with pytest.raises(ClientError) as e:  # the block went well: the restore's failure is the error
        with phases.baseline_phase(fake, fake.ctl):
            pass
    msg = str(e.value)
    assert "\n" not in msg and "tensorrt_llm did not load back" in msg and "out of memory" in msg
    assert "tensorrt_llm UNAVAILABLE, tensorrt_llm_baseline READY" in msg  # what the server is left with
    assert "/v2/repository/models/tensorrt_llm/load" in msg and "restart `trt-spec serve`" in msg
    assert fake.ctl.calls[-1] == ("load", lc.MODEL_NAME)  # tried although the baseline's unload failed
    assert "still READY" in caplog.text  # the unload's failure, logged
    # a failing block: its own error is raised; the failed restore is logged (and noted on it) beside it
    caplog.clear()
    fake = FakeClient(True)
    fake.ctl.fail = {("load", lc.MODEL_NAME): ClientError("out of memory")}
    failure = ClientError("the baseline phase failed")
    with pytest.raises(ClientError) as e:
        with phases.baseline_phase(fake, fake.ctl):
            raise failure
    assert e.value is failure and str(e.value) == "the baseline phase failed"  # the CLI's one line: unchanged
    assert "did not load back" in caplog.text
    assert "did not load back" in "".join(getattr(e.value, "__notes__", ["did not load back"]))


def test_a_second_run_against_the_same_server_fails_with_one_line(served):
    fake = served(True)
    with phases.switch_lock("localhost:9"):  # another run holds it (127.0.0.1 and localhost are the same server)
        with pytest.raises(ClientError) as e:
            phases.measure(fake, [cli_measurement(fake)])
        with phases.switch_lock("10.0.0.1:9"):  # another server: its own lock
            pass
    msg = str(e.value)
    assert "\n" not in msg and "another trt-spec run on this host" in msg and "run again when it is done" in msg
    assert "phase-locks" in msg and fake.ctl.calls == [] and fake.requests == []
    phases.measure(fake, [cli_measurement(fake)])  # released: the next run goes
    assert fake.ctl.calls == ONE_CYCLE


def cli_measurement(fake):
    from trt_spec.harness.bench import ab_measurement
    from trt_spec.harness.prompts import Prompt

    return ab_measurement(fake, [Prompt("a", 3)], warmup=0)


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_streamed_acceptance_is_clamped_and_says_which_correction_applied():
    from trt_spec.harness.bench import RequestSample, request_acceptance_counts
    from trt_spec.harness.client import LLMClient
    from trt_spec.records.speculation import acceptance_summary

    c = LLMClient("127.0.0.1:1", "grpc").use_tokenizer(_Tok())
    parts = lambda texts: [({"text": t, "ids": [], "metrics": {}}, 0.1 * (i + 1)) for i, t in enumerate(texts)]  # noqa
    # a stop string cut the final text: counted up to the longest response (7 tokens in 3 responses), not 2 - 3 < 0
    cut = c._llmapi_result(parts(["ab", "abcd", "abcdefg", "ab"]), 0.5, stream=True)
    assert cut.text == "ab" and cut.metrics["total_accepted_draft_tokens"] == 3
    assert cut.metrics[lc.ACCEPTANCE_NOTE] == lc.STREAM_CUT
    # more responses than tokens (responses without new text): clamped at 0, not negative
    few = c._llmapi_result(parts(["a", "a", "a", "ab"]), 0.5, stream=True)
    assert few.metrics["total_accepted_draft_tokens"] == 0 and few.metrics[lc.ACCEPTANCE_NOTE] == lc.STREAM_CLAMPED
    plain = c._llmapi_result(parts(["ab", "abcd"]), 0.5, stream=True)
    assert plain.metrics["total_accepted_draft_tokens"] == 2 and lc.ACCEPTANCE_NOTE not in plain.metrics
    acc = acceptance_summary(
        request_acceptance_counts([RequestSample.of(SPECULATIVE, i, 0, g) for i, g in enumerate((cut, few, plain))])
    )
    assert acc["accepted"] == 5 and acc["mean_acceptance_length"] >= 1.0
    assert acc["notes"] == sorted([f"{lc.STREAM_CLAMPED} (1 of 3 requests)", f"{lc.STREAM_CUT} (1 of 3 requests)"])
