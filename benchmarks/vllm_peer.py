"""vLLM's CPU build as a peer of benchmarks/peers.py: run in .venv-vllm (`make vllm-peers`), never imported by trt-spec.

Reads a job (JSON, argv[1]) and writes the results (JSON, argv[2]). One offline `vllm.LLM` engine per method, all
alive: `baseline` (no speculation) and each of `ngram` / `suffix`; conversation by conversation, turn by turn, the
engines take turns (the order rotates per turn), each fed its own earlier answers, rendered in the target's chat
template and encoded as trt-spec encodes (add_special_tokens=True); turn 1 is checked against the ids the caller
sent. Greedy (temperature 0), the caller's token budget, stop at the tokenizer's end token only (generation_config
"vllm": nothing from generation_config.json). Accepted and drafted tokens per request from vLLM's per-request
spec-decode metrics (per_request_spec_decode_metrics "summary": CompletionOutput.spec_decode_metrics;
upstream-facts: vllm-per-request-spec-metrics-offline), and the target's forward steps counted as they happen: the
request runs alone through the engine's own step loop with delta outputs, one per step that produced tokens (the
metrics alone cannot give them: upstream-facts: vllm-spec-metrics-past-budget).
"""

from __future__ import annotations

import json
import os
import sys
import time


def speculative_config(method: str, k: int, job: dict) -> dict | None:
    """(upstream-facts: vllm-ngram-config-keys, vllm-suffix-method)"""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, **job["ngram"]}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    return None


def main(job_path: str, out_path: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    job = json.loads(open(job_path).read())
    k = job["k"]
    engines = {}
    for method in ["baseline", *job["methods"]]:
        t0 = time.monotonic()
        engines[method] = LLM(
            model=job["model"],
            dtype="float32",
            max_model_len=job["max_model_len"],
            generation_config="vllm",
            enforce_eager=True,  # no torch.compile: minutes of compiling per engine on 2 cores
            per_request_spec_decode_metrics="summary" if method != "baseline" else "none",
            seed=0,
            speculative_config=speculative_config(method, k, job),
        )
        print(f"[vllm-peer] {method} engine up ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    tok = engines["baseline"].get_tokenizer()
    end_id = int(tok.eos_token_id)

    def render(turns: list[str], answers: list[str]) -> list[int]:
        msgs = []
        for user, answer in zip(turns, answers):
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        msgs.append({"role": "user", "content": turns[len(answers)]})
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return list(tok.encode(text, add_special_tokens=True))

    counter = iter(range(1 << 30))

    def generate(method: str, ids: list[int], max_tokens: int) -> dict:
        """One request alone through the engine's step loop: its tokens, time, and forward steps (each step that
        produced tokens: the prefill, then one verification or decode step each)."""
        engine = engines[method].llm_engine
        sp = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, stop_token_ids=[end_id], output_kind=RequestOutputKind.DELTA
        )
        rid, got, steps, sd = f"r{next(counter)}", [], 0, None
        t0 = time.perf_counter()
        engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), sp)
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.request_id != rid:
                    continue
                c = o.outputs[0]
                if c.token_ids:
                    steps += 1
                    got += list(c.token_ids)
                sd = c.spec_decode_metrics or sd
        latency = time.perf_counter() - t0
        new = [t for t in got if t != end_id]  # trt-spec does not output the end token either
        hist = list(sd.histogram) if sd is not None else []
        return {
            "tokens": len(new),
            "latency_s": latency,
            "steps": steps,  # target forward steps, the prefill's included
            "drafts": sum(hist),  # verify steps that had a proposal
            "drafted": sd.num_draft_tokens if sd is not None else 0,
            "accepted": sum(j * n for j, n in enumerate(hist)),  # a budget-cut last round's includes tokens past it
            "answer": tok.decode(new, skip_special_tokens=True),
        }

    methods = list(engines)
    for item in job["items"][: job["warmup"]]:  # a truncated prompt: the suffix method's global tree keeps every
        for m in methods:  # answer, so warming up on a measured prompt would hand it that prompt's answer
            generate(m, item["first_ids"][:16], 8)
    results, mismatched = [], []
    for i, item in enumerate(job["items"]):
        answers = {m: [] for m in methods}
        for t in range(len(item["turns"])):
            rot = (i + t) % len(methods)
            for m in methods[rot:] + methods[:rot]:
                ids = render(item["turns"], answers[m])
                if t == 0 and ids != item["first_ids"]:
                    mismatched.append(item["id"])
                r = generate(m, ids, item["max_tokens"])
                answers[m].append(r["answer"])
                results.append({"item": i, "turn": t + 1, "method": m, **r})
        print(f"[vllm-peer] {i + 1}/{len(job['items'])} ({item['workload']})", file=sys.stderr, flush=True)
    import vllm

    with open(out_path, "w") as f:
        json.dump(
            {
                "vllm": vllm.__version__,
                "ld_preload": os.environ.get("LD_PRELOAD", ""),
                "template_mismatch": mismatched,
                "results": results,
            },
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
