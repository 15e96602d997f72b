from pathlib import Path

import pytest

from trt_spec.records.config import BuildConfig, ConfigError, defaults_table, load_config, markdown_table

from ..conftest import BUILD_CONFIGS


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


MINIMAL = "target:\n  checkpoint: /m/t\ndraft:\n  checkpoint: /m/d\n"


@pytest.mark.parametrize("path", BUILD_CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_validates(path):
    """It loads, and every value the file sets is the value the build uses (none dropped, renamed or changed)."""
    import yaml

    def unmatched(written, loaded, where=""):
        if isinstance(written, dict):
            return [
                bad
                for k, v in written.items()
                for bad in unmatched(
                    v, loaded.get(k, "<missing>") if isinstance(loaded, dict) else loaded, f"{where}.{k}"
                )
            ]
        return [] if written == loaded else [(where, written, loaded)]

    assert unmatched(yaml.safe_load(path.read_text()), load_config(path).model_dump()) == []


def test_defaults_come_from_the_schema(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.engine == "tensorrt"
    assert cfg.quantization.weights == "fp8" and cfg.quantization.kv_cache == "auto"
    assert cfg.speculative.mode == "draft_target" and cfg.speculative.default_k == cfg.speculative.max_draft_len
    assert cfg.resolved_output_dir(Path("x/my-deploy.yaml")) == Path("build/my-deploy")
    rows = {k: v for k, v, _ in defaults_table()}
    assert rows["limits.max_batch_size"] == BuildConfig.model_fields["limits"].default_factory().max_batch_size
    assert rows["target.checkpoint"] == "(required)"


def test_unknown_key_names_path_and_valid_keys(tmp_path):
    p = write(tmp_path, MINIMAL + "quantization:\n  wieghts: fp8\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "quantization.wieghts: unknown key" in msg and "weights" in msg and "kv_cache" in msg
    assert "\n" not in msg


def test_unknown_top_level_key(tmp_path):
    with pytest.raises(ConfigError, match=r"speculatve: unknown key; valid keys here: .*speculative"):
        load_config(write(tmp_path, MINIMAL + "speculatve: {}\n"))


def test_wrong_type_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"limits\.max_batch_size: .*integer.*'lots'"):
        load_config(write(tmp_path, MINIMAL + "limits:\n  max_batch_size: lots\n"))


def test_bad_literal_lists_valid_values(tmp_path):
    with pytest.raises(ConfigError, match=r"speculative\.mode: .*'draft_target'.*'ngram'.*got 'magic'"):
        load_config(write(tmp_path, MINIMAL + "speculative:\n  mode: magic\n"))


def test_bad_yaml_reports_line(tmp_path):
    with pytest.raises(ConfigError, match=r"line \d+ column \d+: invalid YAML"):
        load_config(write(tmp_path, "target: [unclosed\n"))


def test_missing_required(tmp_path):
    with pytest.raises(ConfigError, match=r"target: required key is missing"):
        load_config(write(tmp_path, "engine: tensorrt\n"))


def test_mode_rules(tmp_path):
    with pytest.raises(ConfigError, match="needs a `draft:` model"):
        load_config(write(tmp_path, "target:\n  checkpoint: /m/t\n"))
    with pytest.raises(ConfigError, match="ngram uses no draft model"):
        load_config(write(tmp_path, MINIMAL + "speculative:\n  mode: ngram\n"))
    with pytest.raises(ConfigError, match="max_input_len .* must be < max_seq_len"):
        load_config(write(tmp_path, MINIMAL + "limits:\n  max_input_len: 100\n  max_seq_len: 100\n"))


def test_set_and_env_overrides(tmp_path):
    p = write(tmp_path, MINIMAL)
    cfg = load_config(
        p,
        ["target.checkpoint=/other", "speculative.max_draft_len=7", "runtime.gpu_device_ids=[2,3]"],
        environ={"TRT_SPEC__DRAFT__CHECKPOINT": "/env/draft", "TRT_SPEC__TARGET__CHECKPOINT": "/env/t"},
    )
    assert cfg.target.checkpoint == "/other"  # --set beats env
    assert cfg.draft.checkpoint == "/env/draft"
    assert cfg.speculative.max_draft_len == 7
    assert cfg.serving.gpu_device_ids == [2, 3]  # `runtime:` as a section: the old name of `serving:`
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(p, ["target.checkpoint"])
    with pytest.raises(ConfigError, match=r"target\.nope: unknown key"):
        load_config(p, ["target.nope=1"])


def test_config_hash_changes_with_content(tmp_path):
    a = load_config(write(tmp_path, MINIMAL))
    b = load_config(write(tmp_path, MINIMAL), ["speculative.max_draft_len=6"])
    assert a.config_hash() != b.config_hash()
    assert a.config_hash() == load_config(write(tmp_path, MINIMAL)).config_hash()


def test_config_keys_table_matches_schema():
    """docs/configs.md's table of keys/defaults is generated from the schema; fail when they drift apart."""
    from ..conftest import REPO

    text = (REPO / "docs" / "configs.md").read_text()
    table = text.split("<!-- config-table:begin -->")[1].split("<!-- config-table:end -->")[0]
    assert table.strip() == markdown_table(), (
        "docs/configs.md drifted: paste the output of `python -m trt_spec.records.config`"
    )


def test_policy_and_proposer_are_enums_that_read_and_write_the_words(tmp_path):
    """speculative.draft_len_policy takes the loop's members of the one policy vocabulary (speculation.Policy): the
    EAGLE chain's former `confidence` (read only from engines exported with it) is refused as any other word."""
    import json

    from trt_spec.records.speculation import Policy, Proposer

    cfg = load_config(write(tmp_path, MINIMAL + "speculative:\n  draft_len_policy: fixed\n  proposer: prompt_lookup\n"))
    assert cfg.speculative.draft_len_policy is Policy.FIXED and cfg.speculative.proposer is Proposer.PROMPT_LOOKUP
    assert json.loads(cfg.canonical_json())["speculative"]["draft_len_policy"] == "fixed"
    with pytest.raises(
        ConfigError, match=r"draft_len_policy: Input should be 'adaptive' or 'fixed' \(got 'confidence'\)"
    ):
        load_config(write(tmp_path, MINIMAL + "speculative:\n  draft_len_policy: confidence\n"))
