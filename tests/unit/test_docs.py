"""The README and every page under docs/ name only commands, options and config keys that exist.

The rules for what counts as a command or a config key are in ``tests/doc_claims.py``. The first test reads the
real documentation; the others hold the checker itself to what it must find and what it must leave alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_claims import (
    ConfigPaths,
    check_markdown,
    cli_root,
    command_of_span,
    commands_in_block,
    doc_files,
    snippets,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def root():
    return cli_root()


@pytest.fixture(scope="module")
def config() -> ConfigPaths:
    return ConfigPaths()


def _problems(markdown: str, root, config: ConfigPaths) -> list[str]:
    return [str(p) for p in check_markdown("page.md", markdown, root, config)]


def test_the_docs_name_only_commands_options_and_config_keys_that_exist(root, config):
    files = doc_files(REPO)
    assert REPO / "README.md" in files and REPO / "docs" / "index.md" in files
    problems = [str(p) for f in files for p in check_markdown(str(f.relative_to(REPO)), f.read_text(), root, config)]
    assert not problems, "the docs disagree with the code:\n" + "\n".join(problems)


def test_the_readme_first_command_is_read_as_a_command():
    """The scan sees commands at all: the README's install line ends in ``codemill run``."""
    readme = (REPO / "README.md").read_text()
    found = [args for s in snippets(readme) if s.lang == "bash" for _, args in commands_in_block(s.text)]
    assert ["run"] in found


def test_unknown_commands_options_and_extra_arguments_are_named_with_the_nearest_valid_one(root, config):
    page = "\n".join([
        "# A page",                                               # 1
        "",                                                       # 2
        "```bash",                                                # 3
        "codemill nightly",                                       # 4
        "codemill run --json \\",                                 # 5
        "    --until train   # a comment --not-an-option",        # 6
        "FOO=1 codemill plan && codemill evaluate m-0123abcd... --suitee humaneval",  # 7
        "codemill plan --jsn \"an unclosed quote",               # 8
        "```",                                                    # 9
        "",                                                       # 10
        "Then `codemill repo-tasks grde` and `codemill compare a b c`.",  # 11
    ])
    assert _problems(page, root, config) == [
        "page.md:4: codemill nightly: codemill has no command 'nightly'; known: " + ", ".join(sorted(root.commands)),
        "page.md:5: codemill run --json --until train: codemill run has no option '--json'; known: "
        + ", ".join(sorted([*(o for p in root.commands["run"].params for o in p.opts), "--help"])),
        "page.md:7: codemill evaluate m-0123abcd... --suitee humaneval: codemill evaluate has no option '--suitee'; "
        "did you mean '--suite'?",
        "page.md:8: codemill plan --jsn \"an unclosed quote: codemill plan has no option '--jsn'; did you mean "
        "'--json'?",
        "page.md:11: codemill repo-tasks grde: codemill repo-tasks has no command 'grde'; did you mean 'grade'?",
        "page.md:11: codemill compare a b c: codemill compare takes 2 argument(s); 'c' is one too many",
    ]


def test_placeholders_values_and_prose_in_output_are_not_claims(root, config):
    page = "\n".join([
        "`codemill --debug <command> ...`, `codemill lineage <model-id>`, `codemill run --source DIR`,",
        "`codemill trajectory <rollouts> --tokenizer <the policy's hf/>`,",
        "`codemill calibrate --seeds N --from-champion`, `codemill\nserve --config=my.yaml`.",
        "",
        "```text",
        "error: MLflow refused the credentials",
        "hint: create them (codemill mlflow-identities creates them)",
        "```",
        "",
        "```bash",
        "codemill run > out.txt 2>&1 | tee log",
        "~/venv/bin/codemill repo-tasks synthesize --repo x=path --out synth/",
        "```",
    ])
    assert _problems(page, root, config) == []


def test_a_span_that_is_not_a_command_is_not_read_as_one():
    assert command_of_span("codemill.<folder>") is None
    assert command_of_span("codemill/configs") is None
    assert command_of_span("codemill run --until train") == ["run", "--until", "train"]


def test_config_keys_must_exist_and_be_written_in_full(root, config):
    page = "\n".join([
        "Lower `rollout.workers` or `train.max_stepz`; set `rl.env: {kind: repo, visible_cases: 3}`.",  # 1
        "",                                                                                        # 2
        "```yaml",                                                                                 # 3
        "train:",                                                                                  # 4
        "  max_steps: 5",                                                                          # 5
        "  lora: {r: 8, alfa: 16}",                                                                # 6
        "ingest:",                                                                                 # 7
        "  sources:",                                                                              # 8
        "    - kind: parquet",                                                                     # 9
        "      content_colum: text",                                                               # 10
        "```",                                                                                     # 11
    ])
    assert _problems(page, root, config) == [
        "page.md:6: config key 'train.lora.alfa' does not exist; did you mean 'train.lora.alpha'?",
        "page.md:10: config key 'ingest.sources.content_colum' does not exist; did you mean "
        "'ingest.sources.content_column'?",
        "page.md:1: config key 'rollout.workers' is not a full path: write 'rl.rollout.workers'",
        "page.md:1: config key 'train.max_stepz' does not exist; did you mean 'train.max_steps'?",
        "page.md:1: config key 'rl.env.visible_cases' is not a field of RepoEnvConfig, the form chosen",
    ]


def test_valid_paths_unions_lists_and_other_dotted_names_pass(root, config):
    page = "\n".join([
        "`rl.env.visible_cases` (a member of the env union), `rl.algorithm.max_steps` (rft's),",
        "`gate.metrics[].uncalibrated_margin`, `ingest.sources[0].path`, `ray_init.num_cpus`,",
        "`train.seeds: N`, `train.nnodes=2`, `problems.augment: {}`, `gate.enabled: false`,",
        "the manifest's `near_dedup.algorithm`, the module `data.fim.assemble`, the file `augment.py`,",
        "the metric `train.problems`, a single name `max_turns`.",
        "",
        "```yaml",
        "apiVersion: v1",
        "kind: Service",
        "```",
        "",
        "```yaml",
        "rl:",
        "  env: {kind: concise, penalty: 0.002}   # a kind a how-to adds: not in the code",
        "  algorithm: {name: rft, max_steps: 50}",
        "```",
        "",
        "`codemill lineage <digest or run id>`",
    ])
    assert _problems(page, root, config) == []
