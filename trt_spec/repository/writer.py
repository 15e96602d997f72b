"""Triton model repository writer: a build manifest (trt_spec/records/manifest.py) -> a complete model repository.

One writer per runtime behind one dispatch: `write_repository` and `repo_record` pick the manifest's runtime writer
from records/recipes.py (Recipe.writer): this module's for runtime engine (below), repository/llmapi.py's for runtime
llmapi; both plan a common.RepoPlan and common.write_planned writes either. `validate_repository` reads any back.

Models (NVIDIA's names, so clients written for tensorrtllm_backend work unchanged):
  preprocessing       python   text -> token ids (HF tokenizer)
  tensorrt_llm        target engine: backend `tensorrtllm` (GPU) or the python reference engine (CPU);
                      the same core tensor interface either way
  tensorrt_llm_draft  draft engine (draft-target mode only), same interface
  postprocessing      python   token ids -> text
  ensemble            the non-speculative baseline: preprocessing -> tensorrt_llm -> postprocessing
  tensorrt_llm_bls    the speculative model: draft (model or n-gram) -> verify with draft_input_ids, streaming

Design choice (streaming): by default engine models and the BLS are *decoupled*. The baseline ensemble then
streams (TTFT measurable) and the BLS calls the engines with decoupled BLS execs and streams each accepted
chunk. NVIDIA's DTM recipe sets every model non-decoupled and loses streaming, but its clients call the models
with unary `infer`, which a decoupled model refuses: `decoupled=False` writes that variant.

The engine models are written by ONE code path for both engines: the same inputs, outputs, batching and
`parameters` block (the `tensorrtllm` backend's keys, from trt_spec/records/backend_contract.py, including the ones
it reads unguarded); only `backend` differs (tensorrtllm on a GPU, python + the reference engine on CPU).

Paths (ABSOLUTE_PATHS): gpt_model_path and tokenizer_dir are absolute, as NVIDIA's templates are filled. The
tensorrtllm backend checks gpt_model_path with std::filesystem::exists on the raw string (TensorRT-LLM
triton_backend/inflight_batcher_llm/src/model_instance_state.cc, ModelInstanceState ctor; stored commit 0c8de69a),
so a relative one resolves against tritonserver's working directory, and a miss is reported as "Both encoder and
decoder model paths are empty". Absolute paths make every launch work: `trt-spec serve`, the printed plain command,
NVIDIA's scripts/launch_triton_server.py, any custom launcher, from any directory. They are this machine's paths, so
`trt-spec serve` restricts Triton's model-config API to the admin key (serve/admin_key.py RESTRICTED_APIS).

Every config.pbtxt is built as Triton's ModelConfig protobuf and serialized; the writer parses every file
back, rejects leftover `${…}` template variables, and checks cross-model references. Writing is atomic.

Engine integrity: before writing anything, every engine whose manifest entry records checksums ("files", from
the build's stamps) is verified against them; the sums are stored in trt_spec_repo.json ("engines": engine dir
-> step, config_path, files) and the reference engine model verifies its engine again when it loads.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from tritonclient.grpc import model_config_pb2 as mc

from ..builder.memory import SHARING_ROLES
from ..records import backend_contract as bc
from ..records.bls_parameters import BlsParameters, PreprocessingParameters
from ..records.integrity import IntegrityError, rebuild_hint, verify
from ..records.manifest import BuildManifest, EngineEntry, RepoRecord
from ..records.names import (
    ACCEPTED_LENGTH_HISTOGRAM,
    BAD_WORDS,
    BASELINE_ENGINE,
    BEAM_WIDTH,
    BLS,
    DRAFT,
    DRAFT_LEN_POLICY,
    DRAFT_LENGTHS,
    EMBEDDING_BIAS,
    ENGINE_MODELS,
    ENSEMBLE,
    MAX_TOKENS,
    NUM_DRAFT_TOKENS,
    NUM_RETURN_SEQUENCES,
    OUTPUT_IDS,
    POST_OUTPUT_IDS,
    SEQUENCE_LENGTH,
    STOP_WORDS,
    STREAM,
    TARGET,
    TENANT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    TOTAL_STEPS,
    USE_DRAFT_LOGITS,
    Post,
    Pre,
)
from ..records.names import (
    POSTPROCESSING as POST,
)
from ..records.names import (
    PREPROCESSING as PRE,
)
from ..records.recipes import RECIPES, Recipe
from ..records.speculation import Mode
from . import llmapi as lr
from .common import (
    RepoPlan,
    RepositoryError,
    model_repo_sources,
    parse_config,
    write_config,  # noqa: F401
    write_planned,
)

if TYPE_CHECKING:
    from ..records.config import LookaheadSpec, SuffixCacheSpec

# (model_repo_sources, RepositoryError, parse_config: repository/common.py, importable from here as before)
LOGITS_TYPE = bc.LOGITS_TYPE


T = mc.DataType.Value


def _io(
    cls,
    name: str,
    dtype: str,
    dims: list[int],
    *,
    optional: bool = False,
    ragged: bool = False,
    reshape: Optional[list[int]] = None,
):
    m = cls(name=name, data_type=T(dtype), dims=dims)
    if cls is mc.ModelInput:
        m.optional = optional
        m.allow_ragged_batch = ragged
    if reshape is not None:
        m.reshape.shape.extend(reshape)
    return m


def inp(*a, **k):
    return _io(mc.ModelInput, *a, **k)


def out(name: str, dtype: str, dims: list[int]):
    return _io(mc.ModelOutput, name, dtype, dims)


def _params(cfg: mc.ModelConfig, params: dict[str, object]) -> None:
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        cfg.parameters[k].string_value = str(v)


def _spec(t: bc.TensorSpec, cls):
    if cls is mc.ModelOutput:
        return out(t.name, t.dtype, list(t.dims))
    return inp(t.name, t.dtype, list(t.dims), optional=t.optional, ragged=t.ragged, reshape=[] if t.scalar else None)


# The `tensorrt_llm` model's tensor interface (names, types and shapes as in NVIDIA's template; the subset
# trt-spec uses), from the contract module.
def engine_inputs() -> list:
    return [_spec(t, mc.ModelInput) for t in bc.INPUTS]


def engine_outputs() -> list:
    return [_spec(t, mc.ModelOutput) for t in bc.OUTPUTS]


@dataclass(frozen=True)
class RepoSettings:
    """What the repository needs from a manifest (GPU or CPU)."""

    engine: str
    max_batch_size: int
    max_seq_len: int
    max_input_len: int  # the longest prompt served: limits.max_input_len, capped by what the engine takes
    max_num_tokens: int
    mode: str
    max_draft_len: int
    num_draft_tokens: int
    ngram_size: int
    tokenizer_dir: str
    draft_len_policy: str
    proposer: str
    engines: dict[str, EngineEntry]  # role -> engine
    kv_fraction: float
    medusa_choices: Optional[list] = None
    eagle_choices: Optional[list] = None
    lookahead: Optional[LookaheadSpec] = None
    orchestrator: bool = False
    draft_kv_tokens: Optional[int] = None  # max_tokens_in_paged_kv_cache of the draft (caps it on a shared GPU)
    decoupled: bool = True
    max_queue_size: int = 0  # engine models' dynamic_batching.default_queue_policy (0 = unbounded, not written)
    suffix_cache: Optional["SuffixCacheSpec"] = None  # speculative.suffix_cache (None: BlsParameters' defaults)

    @property
    def recipe(self) -> Recipe:
        """The engine runtime's row for this engine and mode (records/recipes.py): the engine models' backend and
        the launcher."""
        return RECIPES[("engine", self.engine, Mode(self.mode))]

    @staticmethod
    def from_manifest(m: BuildManifest, decoupled: bool = True, max_queue_size: int = 0) -> "RepoSettings":
        # speculation as built (the manifest's record: mode, k, n-gram size); the config holds only the serving knobs
        built, spec, lim = m.speculative, m.config.speculative, m.limits
        # engine: tensorrt: the target's HF directory (the imported one for a GGUF target, manifest's checkpoint)
        tok = (m.target.checkpoint or m.config.target.checkpoint) if m.config.recipe.gpu else m.target.dir
        tok = tok if tok.startswith("pkg:") else os.path.abspath(tok)  # ABSOLUTE_PATHS
        multi_gpu = any(e.world_size > 1 for e in m.engines.values())
        return RepoSettings(
            engine=m.engine,
            max_batch_size=lim.max_batch_size,
            max_seq_len=lim.max_seq_len,
            max_input_len=min(lim.max_input_len, bc.max_input_len(lim.max_seq_len, lim.max_num_tokens)),
            max_num_tokens=lim.max_num_tokens,
            mode=built.mode,
            max_draft_len=built.max_draft_len,
            num_draft_tokens=built.num_draft_tokens,
            ngram_size=built.ngram_size,
            tokenizer_dir=tok,
            draft_len_policy=spec.draft_len_policy,
            proposer=spec.proposer,
            engines=m.engines,
            kv_fraction=m.runtime.kv_cache_free_gpu_mem_fraction,
            medusa_choices=spec.medusa.choices if spec.medusa else None,
            eagle_choices=spec.eagle.choices if spec.eagle else None,
            lookahead=spec.lookahead,
            orchestrator=multi_gpu and len(m.engines) > 1,
            draft_kv_tokens=m.runtime.draft_max_tokens_in_paged_kv_cache,
            decoupled=decoupled,
            max_queue_size=max_queue_size,
            suffix_cache=spec.suffix_cache,
        )


def engine_config(name: str, role: str, s: RepoSettings) -> mc.ModelConfig:
    """A `tensorrt_llm` model: identical for both engines but for `backend` (see the module docstring)."""
    e = s.engines[role]
    cfg = mc.ModelConfig(name=name, max_batch_size=s.max_batch_size)
    cfg.model_transaction_policy.decoupled = s.decoupled
    cfg.input.extend(engine_inputs())
    cfg.output.extend(engine_outputs())
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    cfg.dynamic_batching.max_queue_delay_microseconds = 0
    if s.max_queue_size > 0:  # the backend's executor reads its queue bound here (backend_contract.QUEUE_FULL)
        cfg.dynamic_batching.default_queue_policy.max_queue_size = s.max_queue_size
    cfg.backend = s.recipe.backend
    params: dict[str, object] = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": os.path.abspath(e.dir),  # ABSOLUTE_PATHS
        "max_beam_width": 1,
        "enable_kv_cache_reuse": True,  # draft_tokens_external targets refuse to load without it
        "enable_chunked_context": False,  # input limit: min(max_seq_len - 1, max_num_tokens), checked upstream
        bc.EXCLUDE_INPUT_IN_OUTPUT: False,
        "kv_cache_free_gpu_mem_fraction": s.kv_fraction,
        "max_tokens_in_paged_kv_cache": s.draft_kv_tokens if role in SHARING_ROLES else None,
        "gpu_device_ids": ",".join(str(d) for d in e.devices) or None,
        "batch_scheduler_policy": "guaranteed_no_evict",
        # read unguarded by the backend (load fails without them); "" = guided decoding off
        "tokenizer_dir": s.tokenizer_dir,
        "xgrammar_tokenizer_info_path": bc.GUIDED_DECODING_OFF,
        "guided_decoding_backend": bc.GUIDED_DECODING_OFF,
    }
    match Mode(s.mode) if role == "target" else None:  # the target's in-engine decoding mode
        case Mode.MEDUSA:
            params["decoding_mode"] = "medusa"
            params["medusa_choices"] = _choices(s.medusa_choices)
        case Mode.EAGLE:
            params["decoding_mode"] = "eagle"
            params["eagle_choices"] = _choices(s.eagle_choices)
        case Mode.LOOKAHEAD:
            la = s.lookahead  # the config sets it for mode lookahead
            params.update(
                decoding_mode="lookahead",
                lookahead_window_size=la.window_size,
                lookahead_ngram_size=la.ngram_size,
                lookahead_verification_set_size=la.verification_set_size,
            )
    _params(cfg, params)
    return cfg


def _choices(choices: Optional[list]) -> Optional[str]:
    # Triton's string form "{0}, {0, 0}, {1}"; None = the backend's default tree
    if not choices:
        return None
    return ", ".join("{" + ", ".join(str(x) for x in c) + "}" for c in choices)


def preprocessing_config(s: RepoSettings) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=PRE, backend="python", max_batch_size=s.max_batch_size)
    cfg.input.extend(
        [
            inp(Pre.QUERY, "TYPE_STRING", [1]),
            inp(Pre.REQUEST_OUTPUT_LEN, "TYPE_INT32", [1]),
            inp(Pre.BAD_WORDS, "TYPE_STRING", [-1], optional=True),
            inp(Pre.STOP_WORDS, "TYPE_STRING", [-1], optional=True),
            inp(Pre.END_ID, "TYPE_INT32", [1], optional=True),
            inp(Pre.PAD_ID, "TYPE_INT32", [1], optional=True),
            *embedding_bias_inputs(Pre.EMBEDDING_BIAS[0], Pre.EMBEDDING_BIAS[1]),
        ]
    )
    cfg.output.extend(
        [
            out(Pre.INPUT_ID, "TYPE_INT32", [-1]),
            out(
                Pre.DECODER_INPUT_ID, "TYPE_INT32", [-1]
            ),  # [[pad_id]]: NVIDIA's end_to_end_test.py reads and forwards it
            out(Pre.REQUEST_INPUT_LEN, "TYPE_INT32", [1]),
            out(Pre.REQUEST_OUTPUT_LEN, "TYPE_INT32", [1]),
            out(Pre.BAD_WORDS_IDS, "TYPE_INT32", [2, -1]),
            out(Pre.STOP_WORDS_IDS, "TYPE_INT32", [2, -1]),
            out(Pre.OUT_END_ID, "TYPE_INT32", [1]),
            out(Pre.OUT_PAD_ID, "TYPE_INT32", [1]),
        ]
    )
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(cfg, PreprocessingParameters(tokenizer_dir=s.tokenizer_dir, max_input_len=s.max_input_len).to_parameters())
    return cfg


def postprocessing_config(s: RepoSettings) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=POST, backend="python", max_batch_size=s.max_batch_size)
    cfg.input.extend([inp(Post.TOKENS_BATCH, "TYPE_INT32", [-1, -1]), inp(Post.SEQUENCE_LENGTH, "TYPE_INT32", [-1])])
    # OUTPUT: NVIDIA's (one string per sequence and beam); OUTPUT_IDS: trt-spec's, the token ids cut to their length
    cfg.output.extend([out(Post.OUTPUT, "TYPE_STRING", [-1]), out(POST_OUTPUT_IDS, "TYPE_INT32", [-1, -1])])
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(cfg, {"tokenizer_dir": s.tokenizer_dir, "skip_special_tokens": True})
    return cfg


def embedding_bias_inputs(words: str, weights: str) -> list:
    """NVIDIA's embedding-bias inputs: its speculative_decoding_test.py sends both, empty ([1, 0]), to the ensemble
    and the BLS on every request. Declared so such requests are served; a non-empty bias is refused with one line."""
    return [inp(words, "TYPE_STRING", [-1], optional=True), inp(weights, "TYPE_FP32", [-1], optional=True)]


def text_inputs(bls: bool) -> list:
    ins = [
        inp(TEXT_INPUT, "TYPE_STRING", [1]),
        inp(MAX_TOKENS, "TYPE_INT32", [1]),
        inp(BAD_WORDS, "TYPE_STRING", [-1], optional=True),
        inp(STOP_WORDS, "TYPE_STRING", [-1], optional=True),
        inp(bc.END_ID, "TYPE_INT32", [1], optional=True),
        inp(bc.PAD_ID, "TYPE_INT32", [1], optional=True),
        inp(TOP_K, "TYPE_INT32", [1], optional=True),
        inp(TOP_P, "TYPE_FP32", [1], optional=True),
        inp(bc.TEMPERATURE, "TYPE_FP32", [1], optional=True),
        inp(bc.SEED, "TYPE_UINT64", [1], optional=True),
        inp(STREAM, "TYPE_BOOL", [1], optional=True),
        inp(bc.EXCLUDE_INPUT_IN_OUTPUT, "TYPE_BOOL", [1], optional=True),
        inp(bc.RETURN_PERF_METRICS, "TYPE_BOOL", [1], optional=True),
        # NVIDIA's end_to_end_grpc_client always sends beam_width; 1 is the only value served
        inp(BEAM_WIDTH, "TYPE_INT32", [1], optional=True),
        inp(NUM_RETURN_SEQUENCES, "TYPE_INT32", [1], optional=True),
        *embedding_bias_inputs(*EMBEDDING_BIAS),
    ]
    if bls:
        ins += [
            inp(NUM_DRAFT_TOKENS, "TYPE_INT32", [1], optional=True),
            inp(USE_DRAFT_LOGITS, "TYPE_BOOL", [1], optional=True),
            inp(DRAFT_LEN_POLICY, "TYPE_STRING", [1], optional=True),
            inp(TENANT, "TYPE_STRING", [1], optional=True),  # the suffix cache's scope (speculative.suffix_cache)
        ]
    return ins


def ensemble_config(s: RepoSettings) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=s.max_batch_size)
    cfg.input.extend(text_inputs(bls=False))
    cfg.output.extend(
        [
            out(TEXT_OUTPUT, "TYPE_STRING", [-1]),
            out(OUTPUT_IDS, "TYPE_INT32", [-1, -1]),
            *(_spec(t, mc.ModelOutput) for t in bc.OUTPUTS if t.name in bc.PERF_OUTPUTS),
        ]
    )
    steps = cfg.ensemble_scheduling.step
    pre = steps.add(model_name=PRE, model_version=-1)
    pre.input_map.update(
        {
            Pre.QUERY: TEXT_INPUT,
            Pre.REQUEST_OUTPUT_LEN: MAX_TOKENS,
            Pre.BAD_WORDS: BAD_WORDS,
            Pre.STOP_WORDS: STOP_WORDS,
            Pre.END_ID: bc.END_ID,
            Pre.PAD_ID: bc.PAD_ID,
            Pre.EMBEDDING_BIAS[0]: EMBEDDING_BIAS[0],
            Pre.EMBEDDING_BIAS[1]: EMBEDDING_BIAS[1],
        }
    )
    pre.output_map.update(
        {
            Pre.INPUT_ID: "_INPUT_ID",
            Pre.REQUEST_INPUT_LEN: "_REQUEST_INPUT_LEN",
            Pre.REQUEST_OUTPUT_LEN: "_REQUEST_OUTPUT_LEN",
            Pre.BAD_WORDS_IDS: "_BAD_WORDS_IDS",
            Pre.STOP_WORDS_IDS: "_STOP_WORDS_IDS",
            Pre.OUT_END_ID: "_END_ID",
            Pre.OUT_PAD_ID: "_PAD_ID",
        }
    )
    # The baseline decodes without speculation: the target itself, or for Medusa/EAGLE/lookahead (whose target engine
    # always speculates) the plain engine built beside it (speculation.Mode.in_engine).
    llm = steps.add(model_name=BASELINE_ENGINE if "baseline" in s.engines else TARGET, model_version=-1)
    llm.input_map.update(
        {
            bc.INPUT_IDS: "_INPUT_ID",
            bc.INPUT_LENGTHS: "_REQUEST_INPUT_LEN",
            bc.REQUEST_OUTPUT_LEN: "_REQUEST_OUTPUT_LEN",
            bc.END_ID: "_END_ID",
            bc.PAD_ID: "_PAD_ID",
            bc.BAD_WORDS_LIST: "_BAD_WORDS_IDS",
            bc.STOP_WORDS_LIST: "_STOP_WORDS_IDS",
            bc.RUNTIME_TOP_K: TOP_K,
            bc.RUNTIME_TOP_P: TOP_P,
            bc.TEMPERATURE: bc.TEMPERATURE,
            bc.SEED: bc.SEED,
            bc.STREAMING: STREAM,
            bc.EXCLUDE_INPUT_IN_OUTPUT: bc.EXCLUDE_INPUT_IN_OUTPUT,
            bc.RETURN_PERF_METRICS: bc.RETURN_PERF_METRICS,
            BEAM_WIDTH: BEAM_WIDTH,
            NUM_RETURN_SEQUENCES: NUM_RETURN_SEQUENCES,
        }
    )
    # The engine's outputs are internal tensors, never ensemble outputs: Triton core prunes a step once every
    # ensemble output it produces is unrequested, without asking whether a later step consumes them (ENSEMBLE_PRUNING).
    llm.output_map.update(
        {OUTPUT_IDS: "_TOKENS_BATCH", SEQUENCE_LENGTH: "_SEQUENCE_LENGTH", **{name: name for name in bc.PERF_OUTPUTS}}
    )  # with return_perf_metrics, as NVIDIA's
    post = steps.add(model_name=POST, model_version=-1)
    post.input_map.update({Post.TOKENS_BATCH: "_TOKENS_BATCH", Post.SEQUENCE_LENGTH: "_SEQUENCE_LENGTH"})
    post.output_map.update({Post.OUTPUT: TEXT_OUTPUT, POST_OUTPUT_IDS: OUTPUT_IDS})
    return cfg


def bls_config(s: RepoSettings) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=BLS, backend="python", max_batch_size=s.max_batch_size)
    cfg.model_transaction_policy.decoupled = s.decoupled
    cfg.input.extend(text_inputs(bls=True))
    cfg.output.extend(
        [
            out(TEXT_OUTPUT, "TYPE_STRING", [-1]),
            out(OUTPUT_IDS, "TYPE_INT32", [-1]),
            # the ten perf outputs of NVIDIA's tensorrt_llm_bls config
            # (all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt): E2E --return-perf-metrics requests them
            # all, and Triton core refuses a request for an undeclared output; filled with return_perf_metrics, summed
            # over the rounds (speculative_loop.EnginePerf)
            *(_spec(t, mc.ModelOutput) for t in bc.OUTPUTS if t.name in bc.PERF_OUTPUTS),
            out(TOTAL_STEPS, "TYPE_INT32", [1]),
            out(ACCEPTED_LENGTH_HISTOGRAM, "TYPE_INT32", [-1]),
            out(DRAFT_LENGTHS, "TYPE_INT32", [-1]),
        ]
    )
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    _params(cfg, bls_parameters(s).to_parameters())
    return cfg


def bls_parameters(s: RepoSettings) -> BlsParameters:
    """The BLS's parameters block (records/bls_parameters.py: the BLS, the loop, the frontend read it back)."""
    return BlsParameters(
        tensorrt_llm_model_name=TARGET,
        tensorrt_llm_draft_model_name=DRAFT if s.mode == "draft_target" else "",
        speculative_mode=Mode(s.mode).bls_mode,  # medusa/eagle/lookahead: "engine", the engine drafts
        max_draft_len=s.max_draft_len,
        num_draft_tokens=s.num_draft_tokens,
        ngram_size=s.ngram_size,
        draft_len_policy=s.draft_len_policy,
        proposer=s.proposer,
        max_seq_len=s.max_seq_len,
        max_num_tokens=s.max_num_tokens,
        max_input_len=s.max_input_len,
        tokenizer_dir=s.tokenizer_dir,
        **(
            {}
            if s.suffix_cache is None
            else {
                "suffix_cache_scope": s.suffix_cache.scope,
                "suffix_cache_max_tokens": s.suffix_cache.max_tokens,
                "suffix_cache_max_sequences": s.suffix_cache.max_sequences,
                "suffix_cache_max_tenants": s.suffix_cache.max_tenants,
            }
        ),
    )


def mpi_ranks(s: RepoSettings) -> int:
    """tritonserver processes to launch under mpirun: one per rank of a single multi-GPU TRT-LLM engine.
    Draft + target with TP/PP > 1 use orchestrator mode (one server, the backend spawns ranks); engines that
    each fit one GPU, and the CPU reference engine, need one plain process."""
    if s.recipe.launcher != "mpirun" or s.orchestrator:
        return 1
    return max(e.world_size for e in s.engines.values())


def repository_configs(s: RepoSettings) -> dict[str, mc.ModelConfig]:
    models = {PRE: preprocessing_config(s), POST: postprocessing_config(s), TARGET: engine_config(TARGET, "target", s)}
    if "draft" in s.engines:
        models[DRAFT] = engine_config(DRAFT, "draft", s)
    if "baseline" in s.engines:
        models[BASELINE_ENGINE] = engine_config(BASELINE_ENGINE, "baseline", s)
    models[ENSEMBLE] = ensemble_config(s)
    models[BLS] = bls_config(s)
    return models


# ---------------------------------------------------------------------------------------------------------
# Validation


def validate_repository(repo: Path, *, require_sources: bool = True) -> dict[str, mc.ModelConfig]:
    """Parse every config.pbtxt back and check cross-model references. Raises RepositoryError. require_sources=False:
    an LLM-API model may lack NVIDIA's model.py (written on a machine without the image; serve refuses it)."""
    repo = Path(repo)
    models: dict[str, mc.ModelConfig] = {}
    llmapi_names: set[str] = set()  # TensorRT-LLM's LLM-API models: checked against their own contract
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        cfg = parse_config(cfg_path)
        if cfg.name != cfg_path.parent.name:
            raise RepositoryError(f"{cfg_path}: name {cfg.name!r} differs from its directory {cfg_path.parent.name!r}")
        llmapi = (cfg_path.parent / "1" / "model.yaml").is_file()
        if cfg.backend == "python" and not llmapi and not (cfg_path.parent / "1" / "model.py").is_file():
            raise RepositoryError(f"{cfg.name}: python backend model without 1/model.py")
        models[cfg.name] = cfg
        if llmapi:
            llmapi_names.add(cfg.name)
    if not models:
        raise RepositoryError(f"{repo}: no models (no */config.pbtxt); run trt-spec repo")
    try:
        lr.validate(repo, models, require_source=require_sources)
    except lr.LlmapiRepositoryError as e:
        raise RepositoryError(str(e)) from None
    for name, cfg in models.items():
        if name in ENGINE_MODELS and name not in llmapi_names:
            try:  # what the tensorrtllm backend checks at load (the CPU stand-in checks the same)
                bc.check_parameters({k: v.string_value for k, v in cfg.parameters.items()})
            except bc.ContractError as e:
                raise RepositoryError(
                    f"{name}: the tensorrtllm backend would refuse to load it: {e}; regenerate with trt-spec repo"
                ) from None
        if cfg.platform == "ensemble":
            _check_ensemble(cfg, models)
        for key in ("tensorrt_llm_model_name", "tensorrt_llm_draft_model_name"):
            ref = cfg.parameters[key].string_value if key in cfg.parameters else ""
            if ref and ref not in models:
                raise RepositoryError(f"{name}: parameter {key} names model {ref!r}, which is not in the repository")
            if ref:
                _check_engine_interface(name, models[ref])
    return models


def _check_engine_interface(caller: str, engine: mc.ModelConfig) -> None:
    have_in = {i.name for i in engine.input}
    have_out = {o.name for o in engine.output}
    for t in (bc.INPUT_IDS, bc.INPUT_LENGTHS, bc.REQUEST_OUTPUT_LEN, bc.DRAFT_INPUT_IDS):
        if t not in have_in:
            raise RepositoryError(f"{caller} calls {engine.name}, which has no input {t!r}")
    for t in bc.MANDATORY_OUTPUTS:
        if t not in have_out:
            raise RepositoryError(f"{caller} calls {engine.name}, which has no output {t!r}")


def pruned_steps(cfg: mc.ModelConfig, requested: set[str]) -> set[int]:
    """The steps Triton core's ensemble scheduler prunes for a request that asks for `requested` (ENSEMBLE_PRUNING:
    core src/ensemble_scheduler/ensemble_scheduler.cc, "Prune ensemble first if not all outputs are requested",
    r24.10 L417-458 (Triton 2.51, this project's CPU server), the same in r25.12 L536-577 and r26.04 L460-501 (Triton
    2.68, the pinned image's)). Every unrequested ensemble output is ignored; each ignored tensor
    decrements its producing step's count, which starts at the step's number of mapped outputs; a step at zero is
    pruned, and its inputs no remaining step reads are ignored in turn. Nothing asks whether a live step still
    consumes an ignored ensemble output, so a step whose every output is an ensemble output disappears when a
    client asks only for what a later step makes of them. (An ensemble input has no producer; the scheduler's
    `tensor_to_prev_step_[name]` then reads step 0, reproduced here.)"""
    steps = list(cfg.ensemble_scheduling.step)
    producer = {t: i for i, st in enumerate(steps) for t in st.output_map.values()}
    consumers: dict[str, set[int]] = {}
    for i, st in enumerate(steps):
        for t in st.input_map.values():
            consumers.setdefault(t, set()).add(i)
    ignored = {o.name for o in cfg.output} - set(requested)
    left: dict[int, int] = {}
    pruned: set[int] = set()
    while ignored:
        newly: set[str] = set()
        for t in ignored:
            i = producer.get(t, 0)
            left[i] = left.get(i, len(steps[i].output_map)) - 1
            if left[i] == 0:
                pruned.add(i)
                for t_in in steps[i].input_map.values():
                    consumers[t_in].discard(i)
                    if not consumers[t_in]:
                        newly.add(t_in)
        ignored = newly
    return pruned


def _needed_steps(cfg: mc.ModelConfig, output: str) -> set[int]:
    """The steps an ensemble output is computed through (its producer and, transitively, theirs)."""
    steps = list(cfg.ensemble_scheduling.step)
    producer = {t: i for i, st in enumerate(steps) for t in st.output_map.values()}
    need, todo = set(), [output]
    while todo:
        i = producer.get(todo.pop())
        if i is not None and i not in need:
            need.add(i)
            todo += list(steps[i].input_map.values())
    return need


def _check_ensemble(cfg: mc.ModelConfig, models: dict[str, mc.ModelConfig]) -> None:
    available = {i.name for i in cfg.input}
    for step in cfg.ensemble_scheduling.step:
        m = models.get(step.model_name)
        if m is None:
            raise RepositoryError(f"{cfg.name}: step model {step.model_name!r} is not in the repository")
        m_in, m_out = {i.name for i in m.input}, {o.name for o in m.output}
        for model_tensor, ens_tensor in step.input_map.items():
            if model_tensor not in m_in:
                raise RepositoryError(f"{cfg.name}: step {step.model_name} maps unknown input {model_tensor!r}")
            if ens_tensor not in available:
                raise RepositoryError(
                    f"{cfg.name}: step {step.model_name} reads {ens_tensor!r}, which no earlier "
                    "step or ensemble input provides"
                )
        required = {i.name for i in m.input if not i.optional}
        missing = required - set(step.input_map)
        if missing:
            raise RepositoryError(
                f"{cfg.name}: step {step.model_name} leaves required input(s) {sorted(missing)} unmapped"
            )
        for model_tensor, ens_tensor in step.output_map.items():
            if model_tensor not in m_out:
                raise RepositoryError(f"{cfg.name}: step {step.model_name} maps unknown output {model_tensor!r}")
            available.add(ens_tensor)
    for o in cfg.output:
        if o.name not in available:
            raise RepositoryError(f"{cfg.name}: output {o.name!r} is produced by no step")
    steps = list(cfg.ensemble_scheduling.step)
    for o in cfg.output:  # a client may ask for any one output alone (NVIDIA's clients ask for text_output only)
        lost = _needed_steps(cfg, o.name) & pruned_steps(cfg, {o.name})
        if lost:
            raise RepositoryError(
                f"{cfg.name}: a request for {o.name!r} alone loses step {steps[max(lost)].model_name}: "
                "Triton's ensemble scheduler prunes a step once every ensemble output it maps is unrequested, even "
                'when a later step reads them; map its outputs to internal tensors ("_NAME") instead'
            )


# ---------------------------------------------------------------------------------------------------------
# Writing


def _python_sources(name: str) -> Path:
    """A python-backend model's source: the shipped model of that name (the engine models: the reference engine's)."""
    return model_repo_sources() / {n: "reference_engine" for n in ENGINE_MODELS}.get(name, name) / "1"


def verify_engines(manifest: BuildManifest) -> None:
    """Every engine against the checksums its build recorded (sizes first, then sha256). Raises RepositoryError."""
    for d, entry in manifest.engine_sums().items():
        try:
            verify(Path(d), entry.files, rebuild_hint(entry.config_path, entry.step) + ", then rerun trt-spec repo")
        except IntegrityError as e:
            raise RepositoryError(str(e)) from None


def write_repository(
    manifest: BuildManifest, dest: Path, *, decoupled: bool = True, max_queue_size: int = 0
) -> dict[str, mc.ModelConfig]:
    """Write the repository atomically (temp dir, validate, rename), by the manifest's runtime writer. Safe to rerun
    over an existing one. decoupled=False: every model non-decoupled (NVIDIA's DTM recipe; unary clients, no
    streaming). max_queue_size > 0: requests waiting for an engine slot beyond it are refused with the executor's
    error. Engines are verified against the manifest's checksums first (hashing reads every engine file once)."""
    if max_queue_size < 0:
        raise RepositoryError(f"max_queue_size must be >= 0 (0 = unbounded), got {max_queue_size}")
    if manifest.config.recipe.writer == "llmapi":
        plan = lr.repo_plan(manifest, decoupled)
    else:
        plan = engine_repo_plan(manifest, decoupled, max_queue_size)
    return write_planned(manifest, plan, dest, validate_repository)


def engine_repo_plan(manifest: BuildManifest, decoupled: bool, max_queue_size: int = 0) -> RepoPlan:
    """runtime: engine's repository: the engine models, pre/postprocessing, the ensemble and the BLS."""
    verify_engines(manifest)
    settings = RepoSettings.from_manifest(manifest, decoupled, max_queue_size)
    configs = repository_configs(settings)

    def write(root: Path) -> None:
        for name, cfg in configs.items():
            write_config(root / name, cfg)
            if cfg.backend == "python":
                for f in _python_sources(name).glob("*.py"):
                    shutil.copy2(f, root / name / "1" / f.name)

    return RepoPlan(configs, repo_record(manifest, decoupled, settings, configs), write)


def repo_record(
    manifest: BuildManifest,
    decoupled: bool = True,
    settings: Optional[RepoSettings] = None,
    configs: Optional[dict[str, mc.ModelConfig]] = None,
) -> RepoRecord:
    """What `trt-spec repo` records next to the models (trt_spec_repo.json): how to launch the repository (processes
    under mpirun, orchestrator mode, GPU ids), its models and the engines' sums, by the manifest's runtime writer.
    Pure: the launch line of a repository that is not written yet (the Kubernetes chart's) is computed from it."""
    if manifest.config.recipe.writer == "llmapi":
        return lr.record(manifest, decoupled, configs if configs is not None else lr.llmapi_models(manifest, decoupled))
    settings = settings or RepoSettings.from_manifest(manifest, decoupled)
    configs = configs if configs is not None else repository_configs(settings)
    return RepoRecord(
        name=manifest.name,
        config_hash=manifest.config_hash,
        engine=manifest.engine,
        world_size=manifest.world_size,
        orchestrator=settings.orchestrator,
        mpi_ranks=mpi_ranks(settings),
        models=sorted(configs),
        decoupled=decoupled,
        gpu_ids=sorted({d for e in settings.engines.values() for d in e.devices}),
        engines=manifest.engine_sums(),
    )
