"""tensorrt_llm / tensorrt_llm_draft on CPU: the trt-spec reference engine behind the `tensorrtllm` backend's
contract (python backend).

The stand-in is at least as strict as the backend it stands in for: it refuses to load without the
parameters the backend reads unguarded, rejects every request the backend or the executor rejects (missing
mandatory outputs, streaming on a non-decoupled model, too many draft tokens, a prompt over the engine's
input limit, beam width or return sequences other than 1) with their own error text, samples like
TensorRT-LLM (no top_k and no top_p: greedy at any temperature) and returns the backend's outputs in its
shapes. Every rule and its source: trt_spec/records/backend_contract.py. The engine itself:
trt_spec/reference/engine.py.

In-flight batching as the backend's executor does it (trt_spec/reference/batching.py): `execute` checks each
request, hands it to the model's one BatchScheduler and returns at once (decoupled); one engine thread runs the
iterations, streams tokens and sends each request's final response when it finishes. Limits: `max_batch_size`
and `max_num_tokens` from the engine's build config, `enable_chunked_context` (parameter) and the model config's
`dynamic_batching.default_queue_policy.max_queue_size` (a full queue gets the executor's error); sources in
backend_contract. A non-decoupled model's `execute` waits for its requests (they still share forwards).
"""

import json
import os
import threading
import time

import torch
import triton_python_backend_utils as pb_utils

from trt_spec.in_triton.engine_metrics import EngineMetricsExporter
from trt_spec.in_triton.serving import (
    collect_at_finalize,
    enable_crash_traces,
    error_line,
    request_inputs,
    resolve_path_parameters,
)
from trt_spec.records import backend_contract as bc
from trt_spec.records.backend_contract import ContractError
from trt_spec.records.integrity import verify_served_engine
from trt_spec.reference.batching import QueueFullError
from trt_spec.reference.standin import INPUT_NAMES, StandIn, model_parameters

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
REPORT_PERIOD_S = 30.0  # batching summary lines of single-sequence forwards, at most this often


class _InFlight:
    """One request handed to the scheduler. `lock` orders everything sent or asked for it (tokens and
    is_cancelled() on the engine thread, the final response on whichever thread resolves it): nothing after the
    final response (24.10 deletes the response factory then, even when that send fails)."""

    def __init__(self, request, req, send, final):
        self.request, self.req, self.send, self.final = request, req, send, final
        self.lock = threading.Lock()
        self.handle = None
        self.done = threading.Event()  # the final response is out (or stored, non-decoupled)


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        cfg = resolve_path_parameters(json.loads(args["model_config"]), args["model_repository"])
        self.name = args["model_name"]
        engine_dir = model_parameters(cfg).get("gpt_model_path", "")
        if os.path.isdir(engine_dir):  # the engine must match the build's checksums (trt_spec_repo.json at the root)
            verify_served_engine(os.path.dirname(os.path.abspath(args["model_repository"])), engine_dir)
        threads = int(os.environ.get("TRT_SPEC_TORCH_THREADS", "0")) or torch.get_num_threads()
        torch.set_num_threads(threads)
        # raises the backend's load error for a config a GPU would not load either: the model fails to load
        self.standin = StandIn.load(cfg, self.name, on_iteration=self._poll_cancelled)
        numerics = self.standin.engine.numerics
        if numerics is not None:  # a test mode: say so, it changes what the speculative path outputs
            pb_utils.Logger.log_warn(
                f"{self.name}: GPU-numerics mode on (TRT_SPEC_GPU_NUMERICS): verification "
                f"forwards perturbed below {numerics.margin} logits, seed {numerics.seed}"
            )
        self.scheduler = self.standin.scheduler
        self.cancel_period_s = self.standin.cancel_period_s
        self._inflight: set = set()  # _InFlight; the set itself guarded by _registry
        self._registry = threading.Lock()
        self._last_poll = float("-inf")
        self._unreported: list = []  # IterationStats not yet in a log line (engine thread)
        self._last_report = time.monotonic()
        # nv_trt_llm_request_metrics, refreshed as the backend's stats thread does (engine_metrics.py)
        period = int(bc.parameter(self.standin.params, "stats_check_period_ms")) / 1000.0
        self.metrics = EngineMetricsExporter(
            pb_utils,
            self.name,
            str(args.get("model_version", "1")),
            self.scheduler.request_counts,
            period,
            pb_utils.Logger.log_error,
        )

    def finalize(self):
        self.standin.close(timeout=5.0)  # unfinished requests resolve with an error: each still gets a final
        self.metrics.close()
        collect_at_finalize()

    def _inputs(self, request):
        return request_inputs(pb_utils, request, INPUT_NAMES)

    def _response(self, req, tokens, progress=None):
        return _triton(self.standin.response(req, tokens, progress))

    # -- engine thread --------------------------------------------------------------------------------
    def _poll_cancelled(self):
        """Scheduler hook (engine thread, before each iteration): ask every request in flight whether it was
        cancelled, at most once per cancellation_check_period_ms, and cancel its handle (its slot frees at the
        next iteration; it finishes with the tokens so far, as the executor finishes a cancelled request)."""
        now = time.monotonic()
        if now - self._last_poll < self.cancel_period_s:
            return
        self._last_poll = now
        with self._registry:
            pending = list(self._inflight)
        for f in pending:
            with f.lock:
                if f.final or f.handle is None or f.handle.cancel_requested:
                    continue
                try:
                    cancelled = f.request.is_cancelled()
                except Exception as e:  # noqa: BLE001 - one request's failure must not stop the others
                    pb_utils.Logger.log_error(f"{self.name}: is_cancelled failed: {e}")
                    continue
            if cancelled:
                f.handle.cancel()

    def _stream(self, f, tokens):
        """on_tokens (engine thread): one streaming response per engine step (one token, or an EAGLE step's accepted
        drafts + one, as the backend streams a speculative step)."""
        with f.lock:
            if f.final:
                return
            try:
                resp = self._response(f.req, tokens, f.handle.progress)
            except ContractError as e:  # fillTritonResponse: one final error response, the request is over
                f.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), FINAL)
                f.handle.cancel()
                return
            f.send(resp, 0)

    def _finished(self, f, future):
        """The request's handle resolved (engine thread, or execute's if it resolved before the callback was
        added): its one final response — the result, or its error."""
        with f.lock:
            try:
                if f.final:
                    return
                error, resp = None, None
                try:
                    res = future.result()
                    final = self.standin.final(f.req, res)  # None: a streamed decode, its tokens went out already
                    resp = _triton(final) if final is not None else None
                except Exception as e:  # noqa: BLE001 - the request failed alone: its error is its final response
                    error = error_line(self.name, e, pb_utils.Logger.log_error)  # (an undeclared output included)
                if error is not None:
                    f.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), FINAL)
                else:
                    f.send(resp, FINAL)
            except Exception as e:  # noqa: BLE001 - a failed final send: the backend has closed the request anyway
                f.final.append(True)
                pb_utils.Logger.log_error(f"{self.name}: the final response failed: {e}")
            finally:
                f.done.set()
        with self._registry:
            self._inflight.discard(f)
            idle = not self._inflight
        if idle:
            self._report()

    def _report(self):
        """When the engine drains: one log line on how many sequences shared each forward since the last line —
        at once when a forward held more than one, else at most every REPORT_PERIOD_S (a lone client's calls
        drain the engine every step)."""
        stats = self.scheduler.stats
        while stats:  # popleft is atomic: an iteration recorded meanwhile goes into the next line
            self._unreported.append(stats.popleft())
        new, now = self._unreported, time.monotonic()
        if not new or (max(s.sequences for s in new) < 2 and now - self._last_report < REPORT_PERIOD_S):
            return
        self._unreported, self._last_report = [], now
        seqs = [s.sequences for s in new]
        pb_utils.Logger.log_info(
            f"{self.name}: batching: {len(new)} iterations, sequences per forward max {max(seqs)} mean "
            f"{sum(seqs) / len(seqs):.2f}, tokens per forward max {max(s.tokens for s in new)}, "
            f"queued max {max(s.waiting for s in new)}"
        )

    # -- execute --------------------------------------------------------------------------------------
    def _submit(self, request, send, final):
        """Check one request as the backend does and hand it to the scheduler. Returns its _InFlight, or None
        when it was answered at once. Raises for a rejected request (its error becomes its final response)."""
        req = self.standin.parse(self._inputs(request), request.requested_output_names())
        if req.warning:  # the executor's own warning (a request_output_len lowered to fit max_seq_len)
            pb_utils.Logger.log_warn(f"{self.name}: {req.warning}")
        if request.is_cancelled():  # cancelled while queued: finish it at once, as the executor does
            send(self._response(req, []), FINAL)
            return None
        f = _InFlight(request, req, send, final)
        on_tokens = (lambda t: self._stream(f, t)) if req.streaming and not req.draft_tokens else None
        handle = self.standin.submit(req, on_tokens)
        with f.lock:  # the callbacks wait until the handle is recorded
            f.handle = handle
            with self._registry:
                self._inflight.add(f)
        handle.future.add_done_callback(lambda fut: self._finished(f, fut))
        return f

    def execute(self, requests):
        responses = [None] * len(requests)
        waiting = []
        for i, request in enumerate(requests):
            final = []  # set once the request's final response is out

            if self.standin.decoupled:
                sender = request.get_response_sender()

                def send(r, flags, s=sender, final=final):
                    if flags & FINAL:  # before sending: a failed final send still deletes the response factory
                        final.append(True)
                    s.send(r, flags=flags) if r is not None else s.send(flags=flags)
            else:

                def send(r, flags, i=i, final=final):
                    responses[i] = r
                    final.append(True)

            try:
                f = self._submit(request, send, final)
                if f is not None:
                    waiting.append(f)
                continue
            except QueueFullError as e:  # the executor's refusal, its own text (backend_contract.QUEUE_FULL)
                error = str(e)
            except Exception as e:  # noqa: BLE001 - client mistakes get their line; our faults are logged in full
                error = error_line(self.name, e, pb_utils.Logger.log_error)
            # Every request gets a final response, whatever happened: a decoupled request left without one
            # would keep its caller (the BLS, a client stream) waiting forever.
            if final:
                pb_utils.Logger.log_error(f"{self.name}: after the final response: {error}")
                continue
            try:
                send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), FINAL)
            except Exception as e:  # noqa: BLE001 - never let one request's failure fail the batch
                pb_utils.Logger.log_error(f"{self.name}: the final error response failed: {e}")
        if self.standin.decoupled:
            return None
        for f in waiting:  # non-decoupled: the responses must be returned from execute
            f.done.wait()
        return responses


def _triton(tensors):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])
