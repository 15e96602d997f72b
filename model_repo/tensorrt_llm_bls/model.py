"""tensorrt_llm_bls: the speculative model (python backend, decoupled, async BLS).

Per request: tokenize -> loop { draft k tokens (draft model `tensorrt_llm_draft` with request_output_len=k,
or n-gram prompt lookup) -> verify with the target `tensorrt_llm` (draft_input_ids, request_output_len =
len(draft) + 1) -> keep the accepted prefix + the target's token } until max_tokens, EOS or a stop word.

Beyond NVIDIA's BLS: streaming (stream=true sends each accepted chunk as its own response), concurrent
requests (async; every request has its own state), whole-request metrics (acceptance_rate,
total_accepted_draft_tokens, total_draft_tokens, total_steps, accepted_length_histogram summed over all
iterations), an output_ids output, and validation errors returned as Triton errors. A non-streaming
request gets exactly one response (HTTP /generate compatible). Works unchanged over the TensorRT-LLM C++
backend and the CPU reference engine: it only uses the core tensor interface.
"""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trt_spec.serving import (IncrementalDetokenizer, RequestError, decode_strings, default_end_id, default_pad_id,
                              encode, find_stop, load_tokenizer, scalar, to_word_list)
from trt_spec.reference.ngram import NgramDraft  # numpy only: safe in the GPU image too

SEED_STRIDE = 1_000_003  # per-iteration seed offset: independent random streams across verify calls


def _in(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _t(name, value, dtype):
    return pb_utils.Tensor(name, np.asarray(value, dtype=dtype))


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        p = {k: v["string_value"] for k, v in cfg["parameters"].items()}
        self.target = p["tensorrt_llm_model_name"]
        self.draft = p.get("tensorrt_llm_draft_model_name") or None
        self.mode = p["speculative_mode"]  # draft_target | ngram | engine
        self.max_draft_len = int(p["max_draft_len"])
        self.default_k = int(p["num_draft_tokens"])
        self.ngram = NgramDraft(max_ngram=int(p["ngram_size"]), k=self.max_draft_len)
        self.max_seq_len = int(p["max_seq_len"])
        self.tokenizer = load_tokenizer(p["tokenizer_dir"])
        self.add_special = p.get("add_special_tokens", "true") == "true"

    # -- parsing / validation -------------------------------------------------------------------------
    def _parse(self, request):
        texts = decode_strings(_in(request, "text_input"))
        if len(texts) != 1:
            raise RequestError(f"text_input must hold exactly one prompt per request (got {len(texts)}); "
                               "send one request per prompt")
        if not texts[0]:
            raise RequestError("text_input is empty; send a non-empty prompt")
        max_tokens = scalar(_in(request, "max_tokens"), None, int)
        if max_tokens is None or max_tokens <= 0:
            raise RequestError(f"max_tokens must be >= 1, got {max_tokens}")
        prompt = encode(self.tokenizer, texts[0], self.add_special)
        if len(prompt) + max_tokens > self.max_seq_len:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds max_seq_len "
                               f"{self.max_seq_len}; lower max_tokens")
        k = scalar(_in(request, "num_draft_tokens"), self.default_k, int)
        if k < 0 or k > self.max_draft_len:
            raise RequestError(f"num_draft_tokens {k} is outside 0..max_draft_len ({self.max_draft_len}); the engine "
                               "was built for at most max_draft_len draft tokens")
        use_logits = bool(scalar(_in(request, "use_draft_logits"), False))
        if use_logits and self.mode != "draft_target":
            raise RequestError("use_draft_logits needs draft-target mode (this deployment has no draft model)")
        temperature = float(scalar(_in(request, "temperature"), 0.0))
        if temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {temperature}")
        return {
            "prompt": prompt, "max_tokens": max_tokens, "k": k, "use_logits": use_logits,
            "stream": bool(scalar(_in(request, "stream"), False)),
            "exclude_input": bool(scalar(_in(request, "exclude_input_in_output"), False)),
            "temperature": temperature,
            "top_k": scalar(_in(request, "top_k"), 0, int),
            "top_p": float(scalar(_in(request, "top_p"), 1.0)),
            "seed": scalar(_in(request, "seed"), None, int),
            "end_id": scalar(_in(request, "end_id"), default_end_id(self.tokenizer), int),
            "pad_id": scalar(_in(request, "pad_id"), default_pad_id(self.tokenizer), int),
            "stop_words": [encode(self.tokenizer, w, False) for w in decode_strings(_in(request, "stop_words")) if w],
            "bad_words": [w for w in decode_strings(_in(request, "bad_words")) if w],
            "perf": bool(scalar(_in(request, "return_perf_metrics"), False)),
        }

    # -- engine calls ---------------------------------------------------------------------------------
    def _engine_inputs(self, r, tokens, out_len, seed_offset):
        ins = [
            _t("input_ids", [tokens], np.int32),
            _t("input_lengths", [[len(tokens)]], np.int32),
            _t("request_output_len", [[out_len]], np.int32),
            _t("end_id", [[r["end_id"]]], np.int32),
            _t("pad_id", [[r["pad_id"]]], np.int32),
            _t("streaming", [[False]], bool),
            _t("exclude_input_in_output", [[True]], bool),
            _t("temperature", [[r["temperature"]]], np.float32),
            _t("runtime_top_k", [[r["top_k"]]], np.int32),
            _t("runtime_top_p", [[r["top_p"]]], np.float32),
        ]
        if r["seed"] is not None:
            ins.append(_t("seed", [[(r["seed"] + seed_offset) % 2**63]], np.uint64))
        if r["bad_words"]:
            ins.append(_t("bad_words_list", [to_word_list(self.tokenizer, r["bad_words"])], np.int32))
        return ins

    async def _call(self, model, inputs, outputs):
        req = pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=inputs)
        result = {}
        for resp in await req.async_exec(decoupled=True):  # a (blocking) iterator; engine calls answer at once
            if resp.has_error():
                raise RuntimeError(f"{model}: {resp.error().message()}")
            for name in outputs:
                t = pb_utils.get_output_tensor_by_name(resp, name)
                if t is not None:
                    arr = t.as_numpy()
                    if name == "output_ids":  # streaming-safe: concatenate chunks
                        prev = result.get(name)
                        flat = arr.reshape(-1)
                        result[name] = flat if prev is None else np.concatenate([prev, flat])
                    else:
                        result[name] = arr
        return result

    async def _draft_tokens(self, r, tokens, k, step):
        if k <= 0:
            return [], None
        if self.mode == "ngram":
            return self.ngram.propose(tokens, k, (r["end_id"],)), None
        if self.mode != "draft_target":
            return [], None
        ins = self._engine_inputs(r, tokens, k, SEED_STRIDE * step + 1)
        outs = ["output_ids"] + (["generation_logits"] if r["use_logits"] else [])
        if r["use_logits"]:
            ins.append(_t("return_generation_logits", [[True]], bool))
        res = await self._call(self.draft, ins, outs)
        draft = [int(x) for x in res["output_ids"]][:k]
        logits = res.get("generation_logits")
        if logits is not None:
            logits = logits.reshape(-1, logits.shape[-1])[: len(draft)]
        return draft, logits

    # -- the loop -------------------------------------------------------------------------------------
    async def _handle(self, request):
        sender = request.get_response_sender()
        try:
            r = self._parse(request)
        except (RequestError, ValueError, TypeError) as e:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        try:
            await self._generate(r, sender)
        except Exception as e:  # an engine error: report it on this request, keep serving others
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"engine call failed: {e}")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _generate(self, r, sender):
        tokens = list(r["prompt"])
        generated: list[int] = []
        k_max = r["k"]
        hist = [0] * (k_max + 1)
        drafted = accepted_total = steps = 0
        detok = IncrementalDetokenizer(self.tokenizer)
        if r["stream"] and not r["exclude_input"]:
            sender.send(self._chunk(r["prompt"], self.tokenizer.decode(r["prompt"], skip_special_tokens=True)))
        done = False
        while not done and len(generated) < r["max_tokens"]:
            remaining = r["max_tokens"] - len(generated)
            k = min(k_max, remaining - 1)
            draft, logits = await self._draft_tokens(r, tokens, k, steps)
            ins = self._engine_inputs(r, tokens, len(draft) + 1, SEED_STRIDE * steps)
            if draft:
                ins.append(_t("draft_input_ids", [draft], np.int32))
                if logits is not None:
                    ins.append(_t("draft_logits", logits[None].astype(np.float32), np.float32))
            res = await self._call(self.target, ins, ["output_ids"])
            new = [int(x) for x in res["output_ids"]][:remaining]
            if not new:
                break
            acc = 0
            while acc < min(len(draft), len(new)) and new[acc] == draft[acc]:
                acc += 1
            steps += 1
            drafted += len(draft)
            accepted_total += acc
            hist[min(acc, k_max)] += 1
            # stop conditions: EOS (kept, like the engine), stop words (kept), budget
            if r["end_id"] in new:
                new = new[: new.index(r["end_id"]) + 1]
                done = True
            start = len(generated)
            generated += new
            cut = find_stop(generated, r["stop_words"], start=start)
            if cut is not None:
                new = new[: cut - start]
                generated = generated[:cut]
                done = True
            tokens += new
            if r["stream"] and new:
                sender.send(self._chunk(new, detok.add(new)))
        metrics = {"drafted": drafted, "accepted": accepted_total, "steps": steps, "hist": hist}
        if r["stream"]:
            tail = detok.flush()
            sender.send(self._final([], tail, metrics), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            ids = generated if r["exclude_input"] else r["prompt"] + generated
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            sender.send(self._final(ids, text, metrics), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    # Outputs carry the batch dimension (max_batch_size > 0): text_output [1, 1], output_ids [1, n], ...
    def _chunk(self, ids, text):
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object)),
            _t("output_ids", [list(ids)], np.int32)])

    def _final(self, ids, text, m):
        rate = m["accepted"] / m["drafted"] if m["drafted"] else 0.0
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object)),
            _t("output_ids", [list(ids)], np.int32),
            _t("acceptance_rate", [[rate]], np.float32),
            _t("total_accepted_draft_tokens", [[m["accepted"]]], np.int32),
            _t("total_draft_tokens", [[m["drafted"]]], np.int32),
            _t("total_steps", [[m["steps"]]], np.int32),
            _t("accepted_length_histogram", [m["hist"]], np.int32),
        ])

    async def execute(self, requests):
        await asyncio.gather(*(self._handle(r) for r in requests))
        return None
