import pytest
import yaml

from codemill.config import PipelineConfig, load_config, load_preset, parse_config, preset_names
from codemill.data.sources import SOURCE_KINDS, FolderSource
from codemill.data.sources.hf import HfDiskSource, HfHubSource
from codemill.data.sources.jsonl import JsonlSource
from codemill.data.sources.parquet import ParquetSource
from codemill.hashing import digest_of
from codemill.models.config import TrainConfig


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


# Bad input must come back as one short line per problem: where (file:line), the field path, what to do.


def _problems(tmp_path, text: str) -> tuple[str, list[str]]:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ValueError) as err:
        load_config(p)
    return str(p), str(err.value).splitlines()


def test_misspelled_key_names_file_line_path_and_nearest_field(tmp_path):
    p, lines = _problems(tmp_path, "train:\n  lr: 0.01\n  max_stepz: 3\n")
    assert lines == [f"{p}:3: train.max_stepz: unknown field 'max_stepz'; did you mean 'max_steps'?"]


def test_misspelled_key_inside_a_list_item(tmp_path):
    p, lines = _problems(tmp_path, "ingest:\n  sources:\n    - path: /x\n    - path: /y\n      kindd: folder\n")
    assert lines == [f"{p}:5: ingest.sources[1].kindd: unknown field 'kindd'; did you mean 'kind'?"]


def test_misspelled_section_and_a_name_with_no_near_match(tmp_path):
    p, lines = _problems(tmp_path, "trian:\n  max_steps: 3\nzzz: 1\n")
    assert lines[0] == f"{p}:1: trian: unknown field 'trian'; did you mean 'train'?"
    assert lines[1].startswith(f"{p}:3: zzz: unknown field 'zzz'; valid fields: name, store_root, ")
    assert len(lines) == 2


def test_wrong_type_says_what_was_expected(tmp_path):
    p, lines = _problems(tmp_path, "train:\n  max_steps: many\n  parallelism: ddpp\n")
    assert lines == [
        f"{p}:2: train.max_steps: expected a valid integer, unable to parse string as an integer; got 'many'",
        f"{p}:3: train.parallelism: expected 'ddp' or 'fsdp'; got 'ddpp'",
    ]


def test_a_section_that_is_not_a_mapping(tmp_path):
    p, lines = _problems(tmp_path, "train: 5\n")
    assert lines == [f"{p}:1: train: expected a valid dictionary or instance of TrainConfig; got 5"]


def test_missing_required_field(tmp_path):
    p, lines = _problems(tmp_path, "ingest:\n  decontamination:\n    eval_sets:\n      - path: x.jsonl\n")
    assert lines == [f"{p}:4: ingest.decontamination.eval_sets[0].name: field required"]


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    p, lines = _problems(tmp_path, "train:\n  max_steps: 3\n  lr: [0.1\nname: x\n")
    assert len(lines) == 1
    assert lines[0].startswith(f"{p}:4:5: invalid YAML: ")


def test_top_level_must_be_a_mapping(tmp_path):
    p, lines = _problems(tmp_path, "- train\n")
    assert lines == [f"{p}:1: top level: expected a valid dictionary or instance of PipelineConfig; got ['train']"]


def test_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match=r"c\.yaml: config file not found$"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ValueError, match="is a directory"):
        load_config(tmp_path)


def test_unknown_preset_suggests_and_lists_presets():
    with pytest.raises(ValueError) as err:
        load_preset("tiyn")
    assert str(err.value) == "unknown preset 'tiyn'; did you mean 'tiny'? known presets: gpu-small, tiny"
    with pytest.raises(ValueError, match="known presets: gpu-small, tiny"):
        load_preset("../configs/tiny")


def test_format_validation_error_without_source_text():
    from pydantic import ValidationError

    from codemill.config import format_validation_error

    with pytest.raises(ValidationError) as err:
        PipelineConfig.model_validate({"ingest": {"near_dedup": {"treshold": 0.5}}, "gate": {"alpha": 2}})
    assert format_validation_error(err.value, "preset x") == [
        "preset x: ingest.near_dedup.treshold: unknown field 'treshold'; did you mean 'threshold'?",
        "preset x: gate.alpha: expected less than 1; got 2",
    ]


def test_a_source_takes_only_its_own_kinds_settings(tmp_path):
    """A table setting on a folder source, or a folder setting on a table source, is one line naming it."""
    p, lines = _problems(tmp_path, "ingest:\n  sources:\n    - path: /src/repo\n      content_column: text\n")
    assert lines == [f"{p}:4: ingest.sources[0].content_column: unknown field 'content_column'; valid fields: "
                     "kind, path, repo, include, exclude, skip_dirs, follow_external_symlinks"]
    p, lines = _problems(tmp_path, "ingest:\n  sources:\n    - kind: parquet\n      path: d/*.parquet\n"
                                   "      skip_dirs: []\n")
    assert len(lines) == 1 and lines[0].startswith(f"{p}:5: ingest.sources[0].skip_dirs: unknown field 'skip_dirs'")


def test_every_registered_kind_round_trips_through_yaml():
    sources = [SOURCE_KINDS[kind](path=f"/data/{kind}", repo="org/r") for kind in SOURCE_KINDS]
    text = yaml.safe_dump({"ingest": {"sources": [s.model_dump(mode="json") for s in sources]}})
    back = parse_config(text, "x.yaml").ingest.sources
    assert [type(s) for s in back] == list(SOURCE_KINDS.values()) and back == sources
    assert [s.digest_config() for s in back] == [s.digest_config() for s in sources]
    assert type(parse_config("ingest: {sources: [{path: /src}]}", "x.yaml").ingest.sources[0]) is FolderSource


def test_each_kind_keeps_the_digest_it_had_when_one_config_served_every_kind():
    """Digests computed before each kind had its own config: the artifacts made then stay valid."""
    pinned = [(FolderSource(path="/src/repo"), "d21474fabd5d"),
              (ParquetSource(path="data/*.parquet", content_column="code"), "e8d8965b620a"),
              (JsonlSource(path="rows.jsonl"), "44622244bb08"),
              (HfDiskSource(path="/d/saved", hf_split="test"), "b5aff80bf44e"),
              (HfHubSource(path="org/set", hf_name="py", hf_revision="v1"), "da498ce1cddc")]
    assert [digest_of(src.digest_config())[:12] for src, _ in pinned] == [digest for _, digest in pinned]
    folder = FolderSource(path="/src/repo")
    assert folder.digest_config() != FolderSource(path="/src/repo", include=["**/*.rs"]).digest_config()
