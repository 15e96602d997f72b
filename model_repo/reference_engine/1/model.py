"""tensorrt_llm / tensorrt_llm_draft on CPU: the trt-spec reference engine behind the `tensorrtllm` backend's
contract (python backend).

The stand-in is at least as strict as the backend it stands in for: it refuses to load without the
parameters the backend reads unguarded, rejects every request the backend or the executor rejects (missing
mandatory outputs, streaming on a non-decoupled model, too many draft tokens, a prompt over the engine's
input limit, beam width or return sequences other than 1) with their own error text, samples like
TensorRT-LLM (no top_k and no top_p: greedy at any temperature) and returns the backend's outputs in its
shapes. Every rule and its source: trt_spec/records/backend_contract.py. The engine itself: trt_spec/reference/engine.py.

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

from trt_spec.records import backend_contract as bc
from trt_spec.records.defaults import PREFIX_CACHE_TOKENS, TOKENS_PER_BLOCK
from trt_spec.records.integrity import verify_served_engine
from trt_spec.reference.batching import BatchScheduler, QueueFullError
from trt_spec.reference.engine import ReferenceEngine, Sampling, kv_bytes_per_position, load_engine
from trt_spec.reference.export import read_engine_meta
from trt_spec.served.serving import enable_crash_traces, error_line

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
INPUT_NAMES = tuple(t.name for t in bc.INPUTS)
# The executor refuses a speculative target without KV-cache block reuse (draft tokens are verified against
# the reused prefix): TensorRT-LLM 1.2 trtGptModelInflightBatching.cpp.
REUSE_REQUIRED = "KV cache block reuse must be enabled for speculative decoding target model"
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
        cfg = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.params = {k: v.get("string_value", "") for k, v in cfg["parameters"].items()}
        bc.check_parameters(self.params)  # raises: the model fails to load, as on a GPU
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
        self.declared = {o["name"] for o in cfg.get("output", [])}  # what Triton core lets a backend write
        logits_type = next((o["data_type"] for o in cfg.get("output", []) if o["name"] == "generation_logits"),
                           bc.LOGITS_TYPE)
        self.config_logits_dtype = bc.TYPE_TO_LOGITS_DTYPE.get(logits_type, logits_type)
        engine_dir = self.params["gpt_model_path"]
        if not os.path.isdir(engine_dir):
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=bc.MODEL_PATHS_EMPTY))
        # the engine must match the build's checksums (stored in trt_spec_repo.json at the repository root)
        verify_served_engine(os.path.dirname(os.path.abspath(args["model_repository"])), engine_dir)
        model = load_engine(engine_dir)
        self.limits = bc.EngineLimits.from_build_config(read_engine_meta(engine_dir)["build_config"],
                                                        vocab_size=model.config.vocab_size)
        # Cancelled requests stop between iterations, checked at most this often (the backend polls the same way).
        self.cancel_period_s = int(bc.parameter(self.params, "cancellation_check_period_ms")) / 1000.0
        reuse = bc.parse_bool(bc.parameter(self.params, "enable_kv_cache_reuse"), "enable_kv_cache_reuse")
        if self.limits.speculative_decoding_mode == "draft_tokens_external" and not reuse:
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=REUSE_REQUIRED))
        chunked = bc.parse_bool(bc.parameter(self.params, "enable_chunked_context"), "enable_chunked_context")
        threads = int(os.environ.get("TRT_SPEC_TORCH_THREADS", "0")) or torch.get_num_threads()
        torch.set_num_threads(threads)
        tokens = bc.parameter(self.params, "max_tokens_in_paged_kv_cache")
        budget = (int(tokens) if tokens else PREFIX_CACHE_TOKENS) * kv_bytes_per_position(model) if reuse else 0
        self.engine = ReferenceEngine(model, self.limits.max_seq_len, budget,
                                      diverge_slack=self.limits.max_draft_len + 1)
        self._inflight: set = set()  # _InFlight; the set itself guarded by _registry
        self._registry = threading.Lock()
        self._last_poll = float("-inf")
        self._unreported: list = []  # IterationStats not yet in a log line (engine thread)
        self._last_report = time.monotonic()
        self.scheduler = BatchScheduler(
            self.engine, max_batch_size=self.limits.max_batch_size, max_num_tokens=self.limits.max_num_tokens,
            max_queue_size=bc.max_queue_size(cfg), chunked_context=chunked, on_iteration=self._poll_cancelled)

    def finalize(self):
        self.scheduler.close(timeout=5.0)  # unfinished requests resolve with an error: each still gets a final

    def _inputs(self, request):
        out = {}
        for name in INPUT_NAMES:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                out[name] = t.as_numpy()
        return out

    def _response(self, req, tokens, progress=None, logits=None):
        """One response in the backend's outputs for the request's flags; an output the backend would write that this
        model's config does not declare fails it with Triton core's error (backend_contract.UNDECLARED_OUTPUT)."""
        tensors = bc.response_tensors(req, tokens, perf=_perf(req, progress), logits=logits, declared=self.declared,
                                      model=self.name)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in tensors.items()])

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

    def _stream(self, f, token):
        """on_token (engine thread): one streaming response per token."""
        with f.lock:
            if f.final:
                return
            try:
                resp = self._response(f.req, [token], f.handle.progress)
            except bc.ContractError as e:  # fillTritonResponse: one final error response, the request is over
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
                    if not (f.req.streaming and not f.req.draft_tokens):  # streaming: the tokens went out already
                        logits = torch.stack(res.logits).float().numpy() if res.logits else None
                        resp = self._response(f.req, res.tokens, res, logits)
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
            f"queued max {max(s.waiting for s in new)}")

    # -- execute --------------------------------------------------------------------------------------
    def _submit(self, request, send, final):
        """Check one request as the backend does and hand it to the scheduler. Returns its _InFlight, or None
        when it was answered at once. Raises for a rejected request (its error becomes its final response)."""
        req = bc.parse_request(self._inputs(request), request.requested_output_names(), self.limits, self.params,
                               decoupled=self.decoupled, config_logits_dtype=self.config_logits_dtype)
        if req.warning:  # the executor's own warning (a request_output_len lowered to fit max_seq_len)
            pb_utils.Logger.log_warn(f"{self.name}: {req.warning}")
        if request.is_cancelled():  # cancelled while queued: finish it at once, as the executor does
            send(self._response(req, []), FINAL)
            return None
        if req.bad_words:
            raise bc.ContractError("bad_words is not supported by the reference engine; drop it from the request")
        greedy = req.greedy
        # TensorRT-LLM's kernels scale by the sent temperature and clamp to the logits dtype first (kernel_logits);
        # the sampling rule then runs at temperature 1 (or argmax when greedy).
        sampling = Sampling(0.0 if greedy else 1.0, 0 if greedy else req.top_k,
                            1.0 if greedy or req.top_p == 0.0 else req.top_p, req.seed,
                            kernel_temperature=req.temperature, logits_dtype=self.limits.logits_dtype)
        f = _InFlight(request, req, send, final)
        if req.draft_tokens:
            dl = torch.from_numpy(req.draft_logits) if req.draft_logits is not None else None
            draft = req.draft_tokens[: req.output_len - 1] if req.output_len > 1 else []
            handle = self.scheduler.submit_verify(req.input_ids, draft, sampling, draft_logits=dl, end_id=req.end_id)
        else:
            on_token = (lambda t: self._stream(f, t)) if req.streaming else None
            handle = self.scheduler.submit_generate(
                req.input_ids, req.output_len, sampling, end_id=req.end_id, stop_words=req.stop_words,
                return_logits=req.return_generation_logits, on_token=on_token)
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

            if self.decoupled:
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
        if self.decoupled:
            return None
        for f in waiting:  # non-decoupled: the responses must be returned from execute
            f.done.wait()
        return responses


def _perf(req, progress):
    """The executor's RequestPerfMetrics for a response, from the request's progress (a CallResult): KV blocks of
    TOKENS_PER_BLOCK positions (reused = prompt blocks found in the prefix cache), steady-clock times, and the
    draft tokens this call verified. A verification fills the prompt's and the drafts' positions; a decode, the
    prompt's and the generated tokens'."""
    if progress is None:
        return bc.PerfMetrics()
    positions = len(req.input_ids) + (len(req.draft_tokens) if req.draft_tokens else len(progress.tokens))
    total = -(-positions // TOKENS_PER_BLOCK)
    reused = progress.reused_tokens // TOKENS_PER_BLOCK
    return bc.PerfMetrics(kv_new_blocks=total - reused, kv_reused_blocks=reused, kv_total_blocks=total,
                          arrival_ns=progress.arrival_ns, first_scheduled_ns=progress.scheduled_ns,
                          first_token_ns=progress.first_token_ns, last_token_ns=progress.last_token_ns,
                          accepted=progress.accepted, drafted=progress.drafted)
