"""distill.run on a tiny random Llama teacher with a word-level tokenizer and
a tiny corpus."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from trt_spec.reference import distill  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(253)]  # ids 3..255; 0 <unk>, 1 <s>, 2 </s>


def make_teacher(d: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    d.mkdir(parents=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(d))
    return d


def make_corpus(d: Path) -> list[Path]:
    """Three files of a repetitive word pattern (learnable: the raw-text loss must fall)."""
    d.mkdir(parents=True)
    files = []
    for f in range(3):
        words = [WORDS[(7 * i + f) % 40] for i in range(400)]
        p = d / f"mod{f}.py"
        p.write_text(" ".join(words))
        files.append(p)
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    teacher = make_teacher(root / "teacher")
    files = make_corpus(root / "corpus")
    out = root / "draft"
    cfg = distill.DistillConfig(
        teacher,
        out,
        hidden=32,
        layers=1,
        steps=40,
        seq_len=16,
        seed=0,
        lr=1e-2,
        batch=4,
        head_dim=16,
        teacher_chunks=4,
        raw_chunks=24,
        eval_chunks=1,
        topk=8,
        chat_prompts=2,
        chat_tokens=4,
        eval_chat_prompts=1,
        neg_samples=16,
        corpus_files=files,
        threads=1,
    )
    report = distill.run(cfg)
    return teacher, out, report


def test_output_is_a_loadable_llama_with_the_teachers_vocab(built):
    from transformers import LlamaForCausalLM

    teacher, out, report = built
    draft = LlamaForCausalLM.from_pretrained(str(out))
    tcfg = json.loads((teacher / "config.json").read_text())
    assert draft.config.vocab_size == tcfg["vocab_size"] == 256
    assert (draft.config.bos_token_id, draft.config.eos_token_id) == (tcfg["bos_token_id"], tcfg["eos_token_id"])
    assert draft.config.hidden_size == 32 and draft.config.num_hidden_layers == 1
    assert draft.config.tie_word_embeddings
    # the saved weights are the trained ones: the report's parameter count matches and logits are finite
    assert sum(p.numel() for p in draft.parameters()) == report["params"]
    logits = draft(input_ids=torch.tensor([[1, 5, 6, 7]])).logits
    assert logits.shape == (1, 4, 256) and torch.isfinite(logits).all()


def test_tokenizer_files_copied_verbatim(built):
    teacher, out, _ = built
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (teacher / name).read_bytes()


def test_report_fields_and_loss_decreases(built):
    _, out, report = built
    on_disk = json.loads((out / distill.REPORT_NAME).read_text())
    assert on_disk == json.loads(json.dumps(report))
    for key in ("steps", "seconds", "final_loss", "heldout_code_top1", "chat_top1", "params", "cost", "loss_curve"):
        assert key in report, key
    assert report["steps"] == 40
    # the agreements are the saved draft's full-vocabulary argmax against the teacher's, recomputed here
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    teacher_dir = out.parent / "teacher"
    teacher = LlamaForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32).eval()
    draft = LlamaForCausalLM.from_pretrained(str(out)).eval()
    tok = Tokenizer.from_file(str(teacher_dir / "tokenizer.json"))

    def argmax(model, ids):
        with torch.inference_mode():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].argmax(-1)

    # held-out code: the middle 16 tokens of the corpus file never trained on (a 3-file corpus holds out its last)
    ids = tok.encode((out.parent / "corpus" / "mod2.py").read_text(), add_special_tokens=False).ids
    chunk = ids[(len(ids) - 16) // 2 :][:16]
    agree = int((argmax(draft, chunk) == argmax(teacher, chunk)).sum())
    assert report["heldout_code_positions"] == 16 and report["heldout_code_top1"] == agree / 16
    # chat: the teacher's greedy answer (at most chat_tokens = 4) to the first evaluation prompt
    prompt = tok.encode(distill.CHAT_FORMAT.format(distill.EVAL_CHAT_PROMPTS[0]), add_special_tokens=False).ids
    with torch.inference_mode():
        seq = teacher.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt)).long(),
            max_new_tokens=4,
            min_new_tokens=1,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=2,
            top_p=None,
            top_k=None,
            temperature=None,
        )[0].tolist()
    answer = seq[len(prompt) :]
    answer = answer[: answer.index(2) + 1] if 2 in answer else answer
    guessed = argmax(draft, prompt + answer[:-1])[len(prompt) - 1 :]
    assert report["chat_positions"] == len(answer)
    assert report["chat_top1"] == int((guessed == torch.tensor(answer)).sum()) / len(answer)
    assert 0 < report["cost"]["macs_ratio"] < 1
    assert report["cost"]["draft_decode_ms"] > 0 and report["cost"]["teacher_decode_ms"] > 0
    # training made progress on both objectives
    assert report["final_raw_ce"] < report["first_raw_ce"] - 0.5
    assert report["final_teacher_kl"] < report["first_teacher_kl"]
    assert report["final_loss"] < report["first_loss"]


def test_same_seed_same_bytes_other_seed_differs(built, tmp_path):
    teacher, _, _ = built
    files = sorted((teacher.parent / "corpus").glob("*.py"))
    kw = dict(
        hidden=32,
        layers=1,
        steps=6,
        seq_len=16,
        batch=2,
        head_dim=16,
        teacher_chunks=2,
        raw_chunks=8,
        eval_chunks=1,
        topk=4,
        chat_prompts=1,
        chat_tokens=3,
        eval_chat_prompts=0,
        neg_samples=8,
        corpus_files=files,
        threads=1,
        measure_cost=False,
    )
    distill.run(distill.DistillConfig(teacher, tmp_path / "a", seed=0, **kw))
    distill.run(distill.DistillConfig(teacher, tmp_path / "b", seed=0, **kw))  # the same run again
    distill.run(distill.DistillConfig(teacher, tmp_path / "c", seed=1, **kw))
    blobs = [(tmp_path / name / "model.safetensors").read_bytes() for name in "abc"]
    assert blobs[0] == blobs[1]
    assert blobs[0] != blobs[2]


def test_dtype_bfloat16_saves_a_bf16_draft_the_gpu_plan_asks_for(built, tmp_path):
    """engine: tensorrt's distill-draft step passes --dtype bfloat16 (plan.GPU_SOURCE_DTYPE): the LLM API serves the
    directory's dtype and quantize.py --dtype auto would turn float32 into float16."""
    from safetensors import safe_open

    teacher, _, _ = built
    files = sorted((teacher.parent / "corpus").glob("*.py"))
    a = distill._parser().parse_args(["--teacher", "t", "--output_dir", "o", "--dtype", "bfloat16"])
    assert a.dtype == "bfloat16"
    distill.run(
        distill.DistillConfig(
            teacher,
            tmp_path / "bf16",
            hidden=32,
            layers=1,
            steps=2,
            seq_len=16,
            batch=2,
            head_dim=16,
            teacher_chunks=2,
            raw_chunks=8,
            eval_chunks=1,
            topk=4,
            chat_prompts=1,
            chat_tokens=3,
            eval_chat_prompts=0,
            neg_samples=8,
            corpus_files=files,
            threads=1,
            measure_cost=False,
            dtype="bfloat16",
        )
    )
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    with pytest.raises(distill.DistillError, match="dtype 'int8'"):
        distill.run(distill.DistillConfig(teacher, tmp_path / "bad", dtype="int8"))


def test_cli_defaults_are_the_configs_and_the_plans_argv_parses():
    defaults = {f.name: f.default for f in dataclasses.fields(distill.DistillConfig)}
    a = distill._parser().parse_args(["--teacher", "t", "--output_dir", "o"])
    assert {k: getattr(a, k) for k in distill.CLI_OPTIONS} == {k: defaults[k] for k in distill.CLI_OPTIONS}
    # the argv trt_spec.builder.plan builds for the distill-draft step
    a = distill._parser().parse_args(
        ["--teacher", "t", "--output_dir", "o", "--hidden", "96", "--layers", "3", "--steps", "7", "--seed", "5"]
    )
    assert (a.hidden, a.layers, a.steps, a.seed, a.lr) == (96, 3, 7, 5, defaults["lr"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        distill.DistillConfig("t", "o").steps = 1
    with pytest.raises(TypeError):
        distill.DistillConfig("t", "o", step=1)  # a misspelt knob is not silently ignored


def test_hidden_basis_keeps_the_top_directions():
    g = torch.Generator().manual_seed(0)
    q = torch.linalg.qr(torch.randn(3, 3, generator=g))[0]
    h = torch.randn(300, 3, generator=g) @ torch.diag(torch.tensor([10.0, 3.0, 0.1])) @ q
    basis = distill.hidden_basis(h, 2)
    assert basis.shape == (3, 2)
    assert torch.allclose(basis.T @ basis, torch.eye(2), atol=1e-5)  # orthonormal
    p = h @ basis
    # the Gram matrix of the projection approximates the original one (the dropped direction is tiny)
    assert (p @ p.T - h @ h.T).norm() / (h @ h.T).norm() < 1e-3
    # the top direction is q's first row (up to the sign convention)
    assert abs(float(basis[:, 0] @ q[0])) > 0.99
    assert torch.equal(distill.hidden_basis(h, 2), basis)  # deterministic


def test_bad_teacher_dir_is_one_clear_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(distill.DistillError, match="no config.json"):
        distill.run(distill.DistillConfig(tmp_path / "empty", tmp_path / "out", hidden=32, steps=1, seq_len=8))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trt_spec.reference.distill",
            "--teacher",
            str(tmp_path / "empty"),
            "--output_dir",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no config.json" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_teacher_without_tokenizer_is_rejected(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    with pytest.raises(distill.DistillError, match="tokenizer.json"):
        distill.run(distill.DistillConfig(d, tmp_path / "out", hidden=32, layers=1, steps=1, seq_len=8))
