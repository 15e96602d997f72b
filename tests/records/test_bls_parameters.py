"""The text models' parameter records: the strings the writer puts in config.pbtxt, and every reader's parse of them."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trt_spec.builder.pipeline import manifest_for_config
from trt_spec.records.bls_parameters import BlsParameters, ParameterError, PreprocessingParameters
from trt_spec.records.speculation import Policy, Proposer
from trt_spec.repository.writer import bls_config, bls_parameters, preprocessing_config

from ..conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "repo"
BLS = BlsParameters(
    tensorrt_llm_model_name="tensorrt_llm",
    tensorrt_llm_draft_model_name="tensorrt_llm_draft",
    speculative_mode="draft_target",
    max_draft_len=5,
    num_draft_tokens=4,
    ngram_size=3,
    draft_len_policy="adaptive",
    proposer="suffix",
    max_seq_len=8192,
    max_num_tokens=8192,
    max_input_len=4096,
    tokenizer_dir="/models/tok",
)


def strings(cfg: mc.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


def test_round_trip():
    p = BLS.to_parameters()
    assert p["max_draft_len"] == "5" and p["add_special_tokens"] == "true" and p["max_input_len"] == "4096"
    back = BlsParameters.from_parameters(p)
    assert back == BLS and back.to_parameters() == p
    assert back.draft_len_policy is Policy.ADAPTIVE and back.proposer is Proposer.SUFFIX
    assert back.add_special_tokens is True and back.num_draft_tokens == 4
    pre = PreprocessingParameters(tokenizer_dir="/t", max_input_len=7, add_special_tokens=False)
    assert pre.to_parameters() == {"tokenizer_dir": "/t", "max_input_len": "7", "add_special_tokens": "false"}
    assert PreprocessingParameters.from_parameters(pre.to_parameters()) == pre


def test_the_readers_defaults():
    p = {
        k: v
        for k, v in BLS.to_parameters().items()
        if k not in ("tensorrt_llm_draft_model_name", "max_input_len", "add_special_tokens")
    }
    # a draft_target block must name its draft model: the draft name's default is read in ngram mode
    with pytest.raises(ParameterError, match="^draft_target mode needs tensorrt_llm_draft_model_name$"):
        BlsParameters.from_parameters(p)
    p["speculative_mode"] = "ngram"
    got = BlsParameters.from_parameters(p)
    assert (got.tensorrt_llm_draft_model_name, got.max_input_len, got.add_special_tokens) == ("", None, True)
    assert BlsParameters.from_parameters({**p, "max_input_len": ""}).max_input_len is None  # empty: absent
    assert "max_input_len" not in got.to_parameters()  # None is not written
    assert PreprocessingParameters.from_parameters({"tokenizer_dir": "/t", "max_input_len": "9"}).add_special_tokens


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("max_draft_len", "five", "tensorrt_llm_bls parameter max_draft_len: expected an integer, got 'five'"),
        (
            "add_special_tokens",
            "True",
            "tensorrt_llm_bls parameter add_special_tokens: expected true or false, got 'True'",
        ),
        (
            "speculative_mode",
            "medusa",
            "tensorrt_llm_bls parameter speculative_mode: 'medusa' is not one of draft_target, ngram, engine",
        ),
        (
            "draft_len_policy",
            "confidence",
            "tensorrt_llm_bls parameter draft_len_policy: 'confidence' is not one of adaptive, fixed",
        ),
        ("proposer", "bigram", "tensorrt_llm_bls parameter proposer: 'bigram' is not one of suffix, prompt_lookup"),
        (
            "tokenizer_dir",
            None,
            "tensorrt_llm_bls parameter tokenizer_dir is missing; write the repository again with `trt-spec repo`",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(key, value, line):
    p = {k: v for k, v in BLS.to_parameters().items() if k != key}
    if value is not None:
        p[key] = value
    with pytest.raises(ParameterError) as e:
        BlsParameters.from_parameters(p)
    assert str(e.value) == line


def test_a_bad_preprocessing_value_names_its_model():
    with pytest.raises(ParameterError, match="^preprocessing parameter max_input_len: expected an integer, got 'x'$"):
        PreprocessingParameters.from_parameters({"tokenizer_dir": "/t", "max_input_len": "x"})


@pytest.mark.parametrize("config", ["llama33-70b-fp8-h100-tp2", "qwen25-coder-32b-ngram-h100", "vicuna-7b-eagle-h100"])
def test_the_writers_dict_is_the_records(config):
    d = manifest_for_config(REPO / "build_configs" / f"{config}.yaml").deployment
    written = strings(bls_config(d, decoupled=True))
    record = bls_parameters(d)
    assert written == record.to_parameters()
    assert BlsParameters.from_parameters(written) == record
    pre = strings(preprocessing_config(d))
    assert PreprocessingParameters.from_parameters(pre).to_parameters() == pre
    assert pre["max_input_len"] == written["max_input_len"]


@pytest.mark.parametrize(
    "golden",
    sorted(GOLDEN.glob("*.tensorrt_llm_bls.pbtxt")) + sorted(GOLDEN.glob("*.preprocessing.pbtxt")),
    ids=lambda p: p.name,
)
def test_every_golden_block_reads_back_to_its_own_strings(golden):
    written = strings(text_format.Parse(golden.read_text(), mc.ModelConfig()))
    kind = BlsParameters if ".tensorrt_llm_bls." in golden.name else PreprocessingParameters
    assert kind.from_parameters(written).to_parameters() == written


def test_a_suffix_cache_setting_travels_from_the_config_to_the_bls_by_name():
    """The config's speculative.suffix_cache keys reach the BLS through the Deployment with no hand-copying: set in
    the YAML, read back from config.pbtxt's suffix_cache_* parameters."""
    sets = ["speculative.suffix_cache.min_match=3", "speculative.suffix_cache.max_tenants=5"]
    m = manifest_for_config(REPO / "build_configs" / "cpu-smollm2-ngram.yaml", sets)
    cache = m.deployment.speculation.suffix_cache
    assert (cache.min_match, cache.max_tenants) == (3, 5)
    cfg = bls_config(m.deployment, decoupled=True)
    p = BlsParameters.from_parameters({k: v.string_value for k, v in cfg.parameters.items()})
    assert p.suffix_cache == cache and cfg.parameters["suffix_cache_min_match"].string_value == "3"
