"""The reference engine behind the `tensorrtllm` backend's contract (records/backend_contract.py), free of Triton.

`StandIn` is a CPU deployment's `tensorrt_llm` model: it checks parameters and requests as the backend and executor
do, runs requests on one BatchScheduler and writes the backend's outputs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Callable, Optional

import numpy as np
import torch

from ..records import backend_contract as bc
from ..records.defaults import PREFIX_CACHE_TOKENS, TOKENS_PER_BLOCK
from ..records.speculation import Policy
from .batching import BatchScheduler, Handle
from .eagle import Eagle3Head
from .engine import CallResult, ReferenceEngine, Sampling, kv_bytes_per_position, load_engine, load_head
from .export import read_engine_meta
from .model import ReferenceModel
from .numerics import GpuNumerics

INPUT_NAMES = tuple(t.name for t in bc.INPUTS)
# upstream-facts: trtllm-spec-needs-kv-reuse
REUSE_REQUIRED = "KV cache block reuse must be enabled for speculative decoding target model"
# Our own error: a TensorRT-LLM eagle engine cannot lack its heads (upstream-facts: trtllm-eagle-heads-in-engine).
EAGLE_HEAD_MISSING = (
    "the engine was built with speculative_decoding_mode eagle but carries no EAGLE-3 head "
    "(eagle3/ in the engine directory); rebuild it with `trt-spec build CONFIG`"
)


def model_parameters(model_config: Mapping) -> dict[str, str]:
    """A model config's parameters: name -> string value."""
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


class StandIn:
    """One `tensorrt_llm` model on the reference engine."""

    def __init__(
        self,
        name: str,
        model: ReferenceModel,
        limits: bc.EngineLimits,
        params: Mapping[str, str],
        *,
        decoupled: bool = False,
        declared: Optional[Iterable[str]] = None,
        config_logits_dtype: str = bc.LOGITS_DTYPE,
        max_queue_size: Optional[int] = None,
        on_iteration: Optional[Callable[[], None]] = None,
        head: Optional[Eagle3Head] = None,
        draft_policy: str = Policy.ADAPTIVE.value,
        numerics: Optional[GpuNumerics] = None,
    ):
        """Raises bc.ContractError for parameters a GPU would not load either."""
        self.name, self.limits, self.params = name, limits, dict(params)
        bc.check_parameters(self.params)
        self.decoupled = decoupled
        self.declared = set(declared) if declared is not None else {t.name for t in bc.OUTPUTS}
        self.config_logits_dtype = config_logits_dtype
        # cancellation is polled between iterations, as the backend does
        self.cancel_period_s = int(bc.parameter(self.params, "cancellation_check_period_ms")) / 1000.0
        reuse = bc.parse_bool(bc.parameter(self.params, "enable_kv_cache_reuse"), "enable_kv_cache_reuse")
        if limits.speculative_decoding_mode == "draft_tokens_external" and not reuse:
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=REUSE_REQUIRED))
        chunked = bc.parse_bool(bc.parameter(self.params, "enable_chunked_context"), "enable_chunked_context")
        tokens = bc.parameter(self.params, "max_tokens_in_paged_kv_cache")
        budget = (int(tokens) if tokens else PREFIX_CACHE_TOKENS) * kv_bytes_per_position(model) if reuse else 0
        if limits.speculative_decoding_mode == "eagle" and head is None:
            raise bc.ContractError(bc.LOAD_ERROR.format(msg=EAGLE_HEAD_MISSING))
        self.engine = ReferenceEngine(
            model,
            limits.max_seq_len,
            budget,
            diverge_slack=limits.max_draft_len + 1,
            head=head if limits.speculative_decoding_mode == "eagle" else None,
            max_draft_len=limits.max_draft_len,
            draft_policy=draft_policy,
            numerics=numerics,
        )
        self.scheduler = BatchScheduler(
            self.engine,
            max_batch_size=limits.max_batch_size,
            max_num_tokens=limits.max_num_tokens,
            max_queue_size=max_queue_size,
            chunked_context=chunked,
            on_iteration=on_iteration,
        )

    @classmethod
    def load(cls, model_config: Mapping, name: str, *, on_iteration: Optional[Callable[[], None]] = None) -> "StandIn":
        """Load from the model config JSON Triton hands the backend."""
        params = model_parameters(model_config)
        bc.check_parameters(params)  # before touching the disk, as the backend does
        outputs = model_config.get("output", [])
        logits_type = next((o["data_type"] for o in outputs if o["name"] == bc.GENERATION_LOGITS), bc.LOGITS_TYPE)
        check_engine_path(params["gpt_model_path"])
        return cls.from_engine_dir(
            name,
            params,
            decoupled=bool(model_config.get("model_transaction_policy", {}).get("decoupled", False)),
            declared={o["name"] for o in outputs},
            config_logits_dtype=bc.TYPE_TO_LOGITS_DTYPE.get(logits_type, logits_type),
            max_queue_size=bc.max_queue_size(model_config),
            on_iteration=on_iteration,
            numerics=GpuNumerics.from_env(),
        )

    @classmethod
    def from_engine_dir(cls, name: str, params: Mapping[str, str], **kw) -> "StandIn":
        """The exported engine at params' gpt_model_path, with limits from its build config."""
        engine_dir = params["gpt_model_path"]
        model = load_engine(engine_dir)
        build = read_engine_meta(engine_dir)["build_config"]
        limits = bc.EngineLimits.from_build_config(build, vocab_size=model.config.vocab_size)
        return cls(
            name,
            model,
            limits,
            params,
            head=load_head(engine_dir, model),
            draft_policy=build.get("eagle_draft_policy", Policy.ADAPTIVE.value),
            **kw,
        )

    def close(self, timeout: Optional[float] = None) -> None:
        self.scheduler.close(timeout)

    def parse(self, inputs: Mapping[str, Optional[np.ndarray]], requested: Iterable[str]) -> bc.EngineRequest:
        """Check one request as the backend and executor do; raises bc.ContractError."""
        return bc.parse_request(
            {n: inputs[n] for n in INPUT_NAMES if inputs.get(n) is not None},
            requested,
            self.limits,
            self.params,
            decoupled=self.decoupled,
            config_logits_dtype=self.config_logits_dtype,
        )

    def sampling(self, req: bc.EngineRequest) -> Sampling:
        """The kernels apply the sent temperature first (kernel_logits), so sampling runs at temperature 1."""
        greedy = req.greedy
        return Sampling(
            0.0 if greedy else 1.0,
            0 if greedy else req.top_k,
            1.0 if greedy or req.top_p == 0.0 else req.top_p,
            req.seed,
            kernel_temperature=req.temperature,
            logits_dtype=self.limits.logits_dtype,
        )

    def submit(self, req: bc.EngineRequest, on_tokens: Optional[Callable[[list[int]], None]] = None) -> Handle:
        """Submit a checked request: a verification with draft tokens, else a decode.

        Raises batching.QueueFullError or bc.ContractError."""
        if req.bad_words:
            raise bc.ContractError("bad_words is not supported by the reference engine; drop it from the request")
        sampling = self.sampling(req)
        if req.draft_tokens:
            dl = torch.from_numpy(req.draft_logits) if req.draft_logits is not None else None
            draft = req.draft_tokens[: req.output_len - 1] if req.output_len > 1 else []
            return self.scheduler.submit_verify(req.input_ids, draft, sampling, draft_logits=dl, end_id=req.end_id)
        return self.scheduler.submit_generate(
            req.input_ids,
            req.output_len,
            sampling,
            end_id=req.end_id,
            stop_words=req.stop_words,
            return_logits=req.return_generation_logits,
            on_tokens=on_tokens,
        )

    def response(
        self,
        req: bc.EngineRequest,
        tokens: list[int],
        progress: Optional[CallResult] = None,
        logits: Optional[np.ndarray] = None,
    ) -> dict[str, np.ndarray]:
        """One response's output tensors; an undeclared output fails as in Triton core."""
        return bc.response_tensors(
            req, tokens, perf=perf_metrics(req, progress), logits=logits, declared=self.declared, model=self.name
        )

    def final(self, req: bc.EngineRequest, res: CallResult) -> Optional[dict[str, np.ndarray]]:
        """The final response of a finished call; None for a streamed decode."""
        if req.streaming and not req.draft_tokens:
            return None
        logits = torch.stack(res.logits).float().numpy() if res.logits else None
        return self.response(req, res.tokens, res, logits)


def check_engine_path(path: str) -> None:
    """Fail like the backend on a missing gpt_model_path, plus a hint.

    (upstream-facts: tensorrtllm-model-path-cwd, tensorrtllm-model-path-error-text)"""
    if os.path.isdir(path):
        return
    where = "" if os.path.isabs(path) else f" from the server's working directory {os.getcwd()}"
    raise bc.ContractError(
        bc.LOAD_ERROR.format(msg=bc.MODEL_PATHS_EMPTY)
        + (
            f" (trt-spec: gpt_model_path {path!r} is not an engine directory{where}; the backend resolves a relative "
            "path against tritonserver's working directory: write the repository again with `trt-spec repo` (absolute "
            "engine paths) or give the engine's absolute path)"
        )
    )


def perf_metrics(req: bc.EngineRequest, progress: Optional[CallResult]) -> bc.PerfOutputs:
    """The executor's RequestPerfMetrics from a request's progress (KV blocks of TOKENS_PER_BLOCK positions)."""
    if progress is None:
        return bc.PerfOutputs()
    positions = len(req.input_ids) + (len(req.draft_tokens) if req.draft_tokens else len(progress.tokens))
    total = -(-positions // TOKENS_PER_BLOCK)
    reused = progress.reused_tokens // TOKENS_PER_BLOCK
    return bc.PerfOutputs(
        kv_new_blocks=total - reused,
        kv_reused_blocks=reused,
        kv_total_blocks=total,
        arrival_ns=progress.arrival_ns,
        first_scheduled_ns=progress.scheduled_ns,
        first_token_ns=progress.first_token_ns,
        last_token_ns=progress.last_token_ns,
        accepted=progress.accepted,
        drafted=progress.drafted,
    )
