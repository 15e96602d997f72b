"""tensorrt_llm_bls: the speculative model (python backend, async BLS) — a thin Triton adapter.

This file only parses the text request, tokenizes, turns engine calls into BLS requests and responses into
Triton responses. The speculative loop itself (draft -> verify, n-gram, in-engine modes, EOS/stop words,
metrics) is trt_spec/in_triton/speculative_loop.py, unit-tested against a strict double of the backend contract.

Beyond NVIDIA's BLS: streaming (stream=true sends each accepted chunk as its own response; decoupled
deployments only), concurrent requests (async; every request has its own state), whole-request metrics
(acceptance_rate, total_accepted_draft_tokens, total_draft_tokens, total_steps, accepted_length_histogram: the
in-engine modes' too, from the engine's streamed steps),
an output_ids output, and validation errors returned as Triton errors. A non-streaming request gets exactly
one response. NVIDIA's clients' beam_width / num_return_sequences inputs are accepted when 1. The optional `tenant`
input scopes the n-gram suffix proposer's cross-request cache (speculative.suffix_cache; docs/draft-policy.md).

return_perf_metrics: every response (each streamed chunk too, as the backend writes them) carries the ten perf
outputs NVIDIA's tensorrt_llm_bls declares, for the whole request so far: KV-cache blocks summed over every engine
call of the speculative rounds (draft and target), timestamps from the first and last calls, acceptance from the
loop (speculative_loop.EnginePerf, LoopStats.perf_outputs).

return_profile (optional, trt-spec's): the final response also carries `profile`, a JSON string of where the BLS's
time went, summed over the request's rounds (trt_spec/records/profile.py; `trt-spec bench served --profile`).
"""

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from trt_spec.in_triton.serving import (
    IncrementalDetokenizer,
    check_input_bytes,
    check_no_embedding_bias,
    collect_at_finalize,
    decode_strings,
    default_end_id,
    default_pad_id,
    enable_crash_traces,
    encode,
    end_if_cut,
    error_line,
    input_byte_limit,
    load_tokenizer,
    refuse_if_draining,
    requested_only,
    resolve_path_parameters,
    scalar,
    triton_error,
)
from trt_spec.in_triton.spec_metrics import SpecMetricsExporter
from trt_spec.in_triton.speculative_loop import (
    Cancelled,
    EngineError,
    LoopStats,
    RequestError,
    SpecRequest,
    SpeculativeLoop,
    check_sampling,
    check_tenant,
    validate,
)
from trt_spec.records import backend_contract as bc
from trt_spec.records.bls_parameters import BlsParameters
from trt_spec.records.names import (
    ACCEPTED_LENGTH_HISTOGRAM,
    BAD_WORDS,
    BEAM_WIDTH,
    BLS,
    CACHE_ACCEPTED_TOKENS,
    DRAFT_LEN_POLICY,
    DRAFT_LENGTHS,
    EMBEDDING_BIAS,
    MAX_TOKENS,
    NUM_DRAFT_TOKENS,
    NUM_RETURN_SEQUENCES,
    OUTPUT_IDS,
    PROFILE,
    RETURN_PROFILE,
    STOP_WORDS,
    STREAM,
    TENANT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    TOTAL_STEPS,
    USE_DRAFT_LOGITS,
)
from trt_spec.records.profile import loop_profile

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Client tensor -> engine tensor; forwarded only when the client sent it (TensorRT-LLM: absent top_k/top_p = greedy).
SAMPLING_INPUTS = {
    bc.TEMPERATURE: (bc.TEMPERATURE, np.float32),
    TOP_K: (bc.RUNTIME_TOP_K, np.int32),
    TOP_P: (bc.RUNTIME_TOP_P, np.float32),
}


def _in(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class _Responder:
    """respond(outputs: dict | error: str, flags) for one request. Sends only the outputs the request asked for
    (trt_spec.in_triton.serving.requested_only: the 24.10 stub drops any other without the GIL). `closed` turns true
    just before a final response is handed over: the backend deletes the request's response factory even when that
    send fails, so after it the request may be neither answered nor asked is_cancelled()."""

    def __init__(self, request, deliver):
        self.wanted = request.requested_output_names()
        self.deliver = deliver
        self.closed = False

    def __call__(self, outputs, flags, exc=None):
        if flags & FINAL:
            self.closed = True
        if isinstance(outputs, str):
            self.deliver(pb_utils.InferenceResponse(error=triton_error(pb_utils, outputs, exc)), flags)
        else:
            self.deliver(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in requested_only(outputs, self.wanted).items()]
                ),
                flags,
            )


class TritonPythonModel:
    def initialize(self, args):
        enable_crash_traces(args["model_name"])
        cfg = resolve_path_parameters(json.loads(args["model_config"]), args["model_repository"])
        p = BlsParameters.from_parameters({k: v.get("string_value", "") for k, v in cfg["parameters"].items()})
        self.decoupled = bool(cfg.get("model_transaction_policy", {}).get("decoupled", False))
        # in-engine modes stream the engine call whenever the deployment is decoupled (the engine models are then too):
        # every request, streamed or not, gets the engine's per-step accepted-length histogram (speculative_loop
        # engine_step_histogram); a non-decoupled deployment cannot stream the engine and reports none
        self.loop = SpeculativeLoop(p, self._call, stream_engine=self.decoupled)
        self.default_k = p.num_draft_tokens
        self.tokenizer = load_tokenizer(p.tokenizer_dir)
        self._held: list = []  # finished engine response iterators, kept until a _checkpoint says they are safe
        # Each engine call in flight holds a default-executor worker (req.async_exec runs the blocking exec there
        # until the first response arrives); asyncio's default pool (min(32, cpus + 4) workers) would cap the
        # calls the engines' in-flight batching ever sees. One pool per event loop, installed on first execute.
        self._workers = max(64, 4 * int(cfg.get("max_batch_size", 0) or 0))
        self._pool_loop = None
        self.add_special = p.add_special_tokens
        self.max_prompt_len = p.max_input_len or p.engine_input_limit
        self.byte_limit = input_byte_limit(self.tokenizer, self.max_prompt_len)  # checked before tokenizing
        # Prometheus: trt_spec_* on the metrics port
        self.metrics = SpecMetricsExporter(
            pb_utils,
            args["model_name"],
            p.speculative_mode,
            p.max_draft_len,
            pb_utils.Logger.log_error,
            suffix_cache=self.loop.cache is not None,
            engine_steps=self.loop.stream_engine,
        )

    def finalize(self):
        self.metrics.close()  # metrics before their families, not left to the garbage collector
        collect_at_finalize()

    # -- parsing / validation -------------------------------------------------------------------------
    def _parse(self, request):
        check_no_embedding_bias(*(_in(request, name) for name in EMBEDDING_BIAS))
        for name in (TEXT_INPUT, STOP_WORDS, BAD_WORDS):
            check_input_bytes(_in(request, name), self.byte_limit, name, self.max_prompt_len)
        texts = decode_strings(_in(request, TEXT_INPUT))
        if len(texts) != 1:
            raise RequestError(
                f"{TEXT_INPUT} must hold exactly one prompt per request (got {len(texts)}); send one request per prompt"
            )
        for name in (BEAM_WIDTH, NUM_RETURN_SEQUENCES):
            v = scalar(_in(request, name), 1, int)
            if v != 1:
                raise RequestError(
                    f"{name} {v} is not supported: speculative decoding returns one greedy or sampled "
                    f"sequence (beam width 1); send {name}=1 or omit it"
                )
        stream = bool(scalar(_in(request, STREAM), False))
        if stream and not self.decoupled:
            raise RequestError(
                "stream=true needs the decoupled deployment; write the repository with "
                "`trt-spec repo --decoupled` or send stream=false"
            )
        max_tokens = scalar(_in(request, MAX_TOKENS), 0, int)
        prompt = encode(self.tokenizer, texts[0], self.add_special) if texts[0] else []
        k = scalar(_in(request, NUM_DRAFT_TOKENS), self.default_k, int)
        use_logits = bool(scalar(_in(request, USE_DRAFT_LOGITS), False))
        policy = next(iter(decode_strings(_in(request, DRAFT_LEN_POLICY))), None)
        validate(self.loop.cfg, len(prompt), max_tokens, k, use_logits, policy)
        values = {
            client: scalar(_in(request, client), None, kind)
            for client, kind in ((bc.TEMPERATURE, float), (TOP_K, int), (TOP_P, float), (bc.SEED, int))
        }
        end_id = scalar(_in(request, bc.END_ID), default_end_id(self.tokenizer), int)
        pad_id = scalar(_in(request, bc.PAD_ID), default_pad_id(self.tokenizer), int)
        check_sampling(**values, end_id=end_id, pad_id=pad_id, vocab_size=len(self.tokenizer))
        if values[bc.TEMPERATURE] == 0.0:  # greedy, said the way the engine means it (backend_contract.FP16_LOGITS)
            values.update(temperature=None, top_k=1, top_p=None)
        sampling = {
            engine: np.asarray([[values[client]]], dtype=dtype)
            for client, (engine, dtype) in SAMPLING_INPUTS.items()
            if values[client] is not None
        }
        r = SpecRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            k=k,
            use_logits=use_logits,
            draft_len_policy=policy,
            stream=stream,
            sampling=sampling,
            seed=values[bc.SEED],
            end_id=end_id,
            pad_id=pad_id,
            stop_words=[encode(self.tokenizer, w, False) for w in decode_strings(_in(request, STOP_WORDS)) if w],
            bad_words=[encode(self.tokenizer, w, False) for w in decode_strings(_in(request, BAD_WORDS)) if w],
            perf=bool(scalar(_in(request, bc.RETURN_PERF_METRICS), False)),
            tenant=check_tenant(next(iter(decode_strings(_in(request, TENANT))), None)),
        )
        return (
            r,
            bool(scalar(_in(request, bc.EXCLUDE_INPUT_IN_OUTPUT), False)),
            bool(scalar(_in(request, RETURN_PROFILE), False)),
        )

    # -- engine calls: dicts of arrays <-> BLS requests -----------------------------------------------
    async def _call(self, model, inputs, outputs, on_response=None):
        req = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=list(outputs),
            inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
        )
        responses = await req.async_exec(decoupled=self.decoupled)
        if not self.decoupled:
            return self._collect(model, [responses], on_response)
        if on_response is None:  # one final response (draft and verify calls): it is already here, nothing blocks
            try:
                return self._collect(model, responses, on_response)
            except BaseException:
                for _ in responses:  # drain to the final response: only then does the stub clean the stream up
                    pass
                raise
            finally:
                self._held.append(responses)  # after its last response was taken; released by _checkpoint
        # A streamed call (in-engine modes): the iterator blocks between the engine's responses, so it is read on
        # a worker thread and on_response runs here, on the event loop, as every other call's state does.
        loop = asyncio.get_running_loop()
        it = iter(responses)
        try:
            result, seen = [], 0
            while (resp := await loop.run_in_executor(None, next, it, None)) is not None:
                seen += 1
                result += self._collect(model, [resp], on_response, check_seen=False)
            if not seen:  # as in _collect: none means the call itself failed
                raise EngineError(f"{model}: no response")
            return result
        except BaseException:
            # The request was cancelled (or failed): cancel the engine call where the python backend can
            # (python_backend r25.05+: the BLS response iterator's cancel(); the engine then ends it within one
            # iteration), then drain to its final response, off the loop too (on 24.10 the call runs out).
            cancel = getattr(responses, "cancel", None)
            if cancel is not None:
                try:
                    cancel()
                except Exception as e:  # noqa: BLE001 - the drain below still ends the call
                    pb_utils.Logger.log_warn(f"{BLS}: cancelling {model} failed: {e}")
            await loop.run_in_executor(None, lambda: [None for _ in it])
            raise
        finally:
            self._held.append(responses)  # on the event loop, after its last response was taken

    @staticmethod
    def _collect(model, responses, on_response, check_seen=True) -> list[dict]:
        """Every response's outputs (decoupled: a blocking iterator). An engine error raises EngineError
        "<engine model>: <its message>", the model named once."""
        result, seen = [], 0
        for resp in responses:
            seen += 1
            if resp.has_error():
                msg = resp.error().message()
                raise EngineError(msg if msg.startswith(f"{model}:") else f"{model}: {msg}")
            out = {t.name(): t.as_numpy() for t in resp.output_tensors()}
            if out:
                result.append(out)
                if on_response is not None:
                    on_response(out)
        # A stream always ends with a response; none means the call itself failed (24.10 can hand one failed
        # call's error to another): never pass it off as done.
        if check_seen and not seen:
            raise EngineError(f"{model}: no response")
        return result

    def _checkpoint(self, request) -> bool:
        """request.is_cancelled(), and release the engine responses received before it.

        Triton 2.51's python backend (24.10) keeps each decoupled BLS response iterator in the stub's own map too,
        and erases it on its stub-to-parent thread without the GIL. If Python has let go of the iterator first,
        that erase frees the responses' numpy arrays without the GIL: a reference-count race that corrupts the
        heap under load ("Reference count error detected ... dtype", "malloc(): unaligned fastbin chunk
        detected", then the stub aborts and every request hangs). Upstream fixed ~PbTensor to take the GIL after
        24.12 (python_backend #390). Our side: hold every finished iterator until a round trip through that same
        FIFO thread has completed. is_cancelled() is such a round trip (it queues behind the cleanups and waits),
        except once a request is cancelled (then the answer is cached and nothing is released)."""
        settled = len(self._held)
        cancelled = request.is_cancelled()
        if not cancelled:
            del self._held[:settled]
        return cancelled

    # -- the request ----------------------------------------------------------------------------------
    async def _handle(self, request, respond):
        """Serve one request; whatever happens it gets a final response (a decoupled request left without one
        keeps its client waiting forever)."""
        start = time.perf_counter()  # return_profile: the BLS's part of the request begins here
        self.metrics.in_flight(+1)
        try:
            await self._serve(request, respond, start)
            return
        except (Cancelled, EngineError) as e:  # an engine's error: "<engine model>: <its message>"
            error, exc = str(e), e
        except Exception as e:  # noqa: BLE001 - client mistakes get their line; our faults are logged in full
            error, exc = error_line(BLS, e, pb_utils.Logger.log_error), e
        finally:
            self.metrics.in_flight(-1)
        if respond.closed:  # the final response went out (or failed on the way): nothing more may be sent or asked
            pb_utils.Logger.log_error(f"{BLS}: after the final response: {error}")
            return
        self._checkpoint(request)  # before the final response: after it the request may not be asked anything
        respond(error, FINAL, exc)

    def _stop_requested(self, request) -> bool:
        """The loop asks before each round (and at each streamed response of an in-engine call): True once the client
        cancelled; ShuttingDown once the server's drain timeout has passed."""
        end_if_cut()
        return self._checkpoint(request)

    async def _serve(self, request, respond, start):
        refuse_if_draining()  # a new request, refused while the server drains (ShuttingDown: its client's line)
        r, exclude_input, profile = self._parse(request)  # malformed values: ValueError/TypeError, a client error line
        parsed = time.perf_counter()
        detok = IncrementalDetokenizer(self.tokenizer)
        # Streaming never sends the prompt, whatever exclude_input_in_output says: the engine ignores the flag when
        # streaming (backend_contract.response_tensors), so the ensemble's chunks concatenate to the completion alone.
        m = LoopStats()  # filled by the loop; a streamed chunk carries its perf outputs so far (return_perf_metrics)
        perf = (lambda: m.perf_outputs()) if r.perf else dict
        emit = (
            (lambda new: respond({**self._chunk(new, detok.add(new)), **perf()}, 0)) if r.stream else (lambda new: None)
        )
        streamed = [0.0]  # return_profile: seconds in emit
        if profile:
            emit = self._timed(emit, streamed)
        generated, m = await self.loop.generate(r, emit, lambda: self._stop_requested(request), m)
        looped = time.perf_counter()
        self._checkpoint(request)
        await self.metrics.publish(m)  # finished requests only, before the final response (a client then scrapes them)
        if r.stream:
            out = {**self._final([], detok.flush(), m), **perf()}
        else:
            ids = generated if exclude_input else r.prompt + generated
            out = {**self._final(ids, self.tokenizer.decode(ids, skip_special_tokens=True), m), **perf()}
        if profile:  # summed over the rounds; Triton's part is the client's measured time less this
            p = loop_profile(m.rounds, looped - parsed, streamed[0])
            p.parse_s, p.finish_s = parsed - start, time.perf_counter() - looped
            p.bls_s = p.parse_s + (looped - parsed) + p.finish_s
            out[PROFILE] = np.array([[p.to_json().encode()]], dtype=object)
        respond(out, FINAL)

    @staticmethod
    def _timed(emit, total):
        def timed(new):
            t = time.perf_counter()
            emit(new)
            total[0] += time.perf_counter() - t

        return timed

    # text_output is one string per beam, [1], as NVIDIA's BLS returns it (its clients read
    # `as_numpy("text_output")[0].decode()`); the rest carry the batch dimension: output_ids [1, n], metrics [1, 1].
    @staticmethod
    def _chunk(ids, text) -> dict:
        return {
            TEXT_OUTPUT: np.array([text.encode("utf-8")], dtype=object),
            OUTPUT_IDS: np.asarray([list(ids)], dtype=np.int32),
        }

    def _final(self, ids, text, m) -> dict:
        return {
            **self._chunk(ids, text),
            "acceptance_rate": np.asarray([[m.acceptance_rate]], dtype=np.float32),
            "total_accepted_draft_tokens": np.asarray([[m.accepted]], dtype=np.int32),
            "total_draft_tokens": np.asarray([[m.drafted]], dtype=np.int32),
            TOTAL_STEPS: np.asarray([[m.steps]], dtype=np.int32),
            CACHE_ACCEPTED_TOKENS: np.asarray([[m.cache_accepted]], dtype=np.int32),
            ACCEPTED_LENGTH_HISTOGRAM: np.asarray([m.hist], dtype=np.int32),
            DRAFT_LENGTHS: np.asarray([m.draft_lengths], dtype=np.int32),
        }

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        if self._pool_loop is not loop:  # once per event loop (see initialize)
            loop.set_default_executor(ThreadPoolExecutor(self._workers, thread_name_prefix="bls-exec"))
            self._pool_loop = loop
        if self.decoupled:

            def sender(request):
                s = request.get_response_sender()
                return lambda resp, flags: s.send(resp, flags=flags)

            await asyncio.gather(*(self._handle(r, _Responder(r, sender(r))) for r in requests))
            return None
        results = [None] * len(requests)

        def keep(i):
            return lambda resp, flags: results.__setitem__(i, resp)

        await asyncio.gather(*(self._handle(r, _Responder(r, keep(i))) for i, r in enumerate(requests)))
        return results
