import pytest
import yaml

from codemill.config import PipelineConfig, TrainConfig, load_config, load_preset, preset_names


def test_presets_load():
    assert {"tiny", "gpu-small"} <= set(preset_names())
    tiny = load_preset("tiny")
    assert tiny.train.nproc_per_node == 2 and tiny.train.device == "cpu"
    assert load_preset("gpu-small").train.dtype == "bfloat16"


def test_unknown_preset_names_known_ones():
    with pytest.raises(ValueError, match="tiny"):
        load_preset("nope")


def test_yaml_roundtrip(tmp_path):
    cfg = load_preset("tiny")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(p) == cfg


def test_unknown_field_rejected(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_stepz: 3\n")
    with pytest.raises(ValueError, match="max_stepz"):
        load_config(p)


def test_runtime_fields_do_not_affect_digest_config():
    a, b = TrainConfig(), TrainConfig(timeout_s=5, log_every=1, checkpoint_every=7)
    assert a.digest_config() == b.digest_config()
    assert TrainConfig(lr=1e-4).digest_config() != a.digest_config()
    assert "timeout_s" not in a.digest_config()
    assert "hidden_size" in a.digest_config()["model"]


def test_json_schema_has_descriptions_for_the_ui_form():
    schema = PipelineConfig.model_json_schema()
    train = schema["$defs"]["TrainConfig"]["properties"]
    assert train["max_steps"]["description"]
    assert train["max_steps"]["default"] == 200
