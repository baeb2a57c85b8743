"""Bad command-line input ends in one short `error:` line per problem on stderr and exit status 2, never a
traceback. Every case fails while the config is being loaded, before Prefect or MLflow is touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codemill.cli import app

# Every command that loads a config, with the arguments it needs besides the config options.
COMMANDS = [["run"], ["plan"], ["calibrate"], ["evaluate", "m-0123"], ["lineage", "m-0123"],
            ["compare", "m-0123", "m-4567"]]


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args)


def _error_lines(result) -> list[str]:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), result.stderr
    return lines


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    p = tmp_path / "my.yaml"
    p.write_text("train:\n  max_stepz: 3\n")
    return p


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_reports_a_misspelled_key_in_one_line(command, bad_config):
    lines = _error_lines(_invoke([*command, "--config", str(bad_config)]))
    assert lines == [f"error: {bad_config}:2: train.max_stepz: unknown field 'max_stepz'; did you mean 'max_steps'?"]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_reports_an_unknown_preset_in_one_line(command):
    lines = _error_lines(_invoke([*command, "--preset", "nope"]))
    assert lines == ["error: unknown preset 'nope'; known presets: gpu-small, tiny"]


def test_wrong_type(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text("train:\n  max_steps: many\n")
    lines = _error_lines(_invoke(["run", "--config", str(p)]))
    assert lines == [f"error: {p}:2: train.max_steps: expected a valid integer, unable to parse string as an "
                     "integer; got 'many'"]


def test_an_unknown_rl_algorithm_in_one_line():
    lines = _error_lines(_invoke(["rl", "--algorithm", "ppo"]))
    assert lines == ["error: --algorithm: 'ppo' is not an RL algorithm (one of grpo, rft)"]


def test_switching_the_rule_keeps_the_sampling_temperature(tmp_path, monkeypatch):
    """--algorithm grpo on an rft config at temperature 0.7 gives GRPO at 0.7 (the update scores tokens at the
    sampling temperature), not a refusal of GRPO's default 1.0."""
    import codemill.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "_run_on_problem_sources", lambda cfg, command, start: (seen.setdefault("cfg", cfg), 0))
    monkeypatch.setattr(cli, "print_rl_summary", lambda out, wall_s: None)
    p = tmp_path / "my.yaml"
    p.write_text("rl:\n  algorithm: {name: rft}\n  rollout: {temperature: 0.7}\n")
    result = _invoke(["rl", "--config", str(p), "--algorithm", "grpo", "--iterations", "2"])
    assert result.exit_code == 0, result.output
    rl = seen["cfg"].rl
    assert (rl.algorithm.name, rl.algorithm.temperature, rl.iterations) == ("grpo", 0.7, 2)


def test_a_multi_turn_environment_with_rejection_sampling_in_one_line(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text("rl:\n  algorithm: {name: rft}\n  env: {kind: code_feedback}\n")
    lines = _error_lines(_invoke(["rl", "--config", str(p)]))
    assert len(lines) == 1 and "algorithm rft needs a single-turn environment" in lines[0], lines


@pytest.mark.parametrize(("rl", "says"), [
    ("{env: {kind: repo}}", "rl.rollout.stop must hold '<|im_end|>'"),
    ("{env: {kind: repo}, rollout: {stop: ['<|im_end|>']}, warm_start: {max_steps: 5}}",
     "repository tasks do not have; set rl.warm_start.max_steps: 0"),
])
def test_a_repository_environment_that_cannot_run_as_configured_in_one_line(tmp_path, rl, says):
    p = tmp_path / "my.yaml"
    p.write_text(f"rl: {rl}\n")
    lines = _error_lines(_invoke(["rl", "--config", str(p)]))
    assert len(lines) == 1 and says in lines[0], lines


def test_config_file_that_does_not_exist(tmp_path):
    p = tmp_path / "nothere.yaml"
    assert _error_lines(_invoke(["run", "--config", str(p)])) == [f"error: {p}: config file not found"]


def test_yaml_that_does_not_parse(tmp_path):
    p = tmp_path / "my.yaml"
    p.write_text("train:\n  lr: [0.1\nname: x\n")
    [line] = _error_lines(_invoke(["run", "--config", str(p)]))
    assert line.startswith(f"error: {p}:3:5: invalid YAML: ")


def test_preset_and_config_together(tmp_path):
    p = tmp_path / "ok.yaml"
    src = tmp_path / "src"
    src.mkdir()
    # A valid config over a tiny folder: if the check were missing, `plan` would still finish quickly.
    p.write_text(f"store_root: {tmp_path / 'store'}\ningest:\n  sources:\n    - path: {src}\n")
    [line] = _error_lines(_invoke(["plan", "--config", str(p), "--preset", "gpu-small"]))
    assert "--config" in line and "--preset" in line and "not both" in line


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_source_that_is_not_a_folder(tmp_path, kind):
    path = tmp_path / "src.py"
    if kind == "file":
        path.write_text("x = 1\n")
    result = _invoke(["plan", "--source", str(path), "--store", str(tmp_path / "store")])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and len(result.stderr.splitlines()) <= 6
    assert "--source" in result.stderr and str(path) in result.stderr.replace("\n", "").replace("│", "")


@pytest.mark.parametrize("args", [["run", "--preset", "nope"], ["run", "--config", "{bad}"]])
def test_real_process_prints_no_traceback(args, bad_config):
    """The installed entry point as a user runs it (CliRunner would swallow a traceback)."""
    argv = [a.replace("{bad}", str(bad_config)) for a in args]
    proc = subprocess.run([sys.executable, "-m", "codemill.cli", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert ("known presets: gpu-small, tiny" in line) if "nope" in argv else ("did you mean 'max_steps'?" in line)


def test_an_unknown_until_stops_before_prefect_is_imported(tmp_path):
    """``--until`` is checked before the temporary Prefect server starts or the flows import (a usage error
    costs no server boot)."""
    code = ("import sys\nfrom codemill.cli import app\ntry:\n"
            "    app(['run', '--until', 'deploy', '--store', sys.argv[1]])\n"
            "except SystemExit as e:\n    print(e.code, 'prefect' in sys.modules, flush=True)\n    raise\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.split() == ["2", "False"]
    assert "until must be one of ingest, tokenize" in proc.stderr and "'deploy'" in proc.stderr


def test_a_dead_trainer_is_named_by_the_error_a_rank_died_of():
    """torchrun's own summary (ChildFailedError, a table of exit codes) names no cause: the one-line report
    carries the last exception a rank printed."""
    from codemill.errors import describe
    from codemill.models.launch import TrainingFailed

    tail = ["Traceback (most recent call last):", '  File "trainer.py", line 3, in main',
            "[rank0]: ValueError: sequence length 4096 exceeds the model's 2048",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
            "  exitcode  : 1 (pid: 123)"]
    failed = TrainingFailed("torchrun exited with code 1. Last output:\n" + "\n".join(tail), tail)
    what, hint = describe(failed)
    assert what == "torchrun exited with code 1: ValueError: sequence length 4096 exceeds the model's 2048"
    assert hint and "resumes" in hint
    assert describe(TrainingFailed("torchrun exited with code 1. Last output:\n", []))[0] == (
        "torchrun exited with code 1.")


def test_an_unknown_exception_keeps_its_traceback():
    from codemill.errors import describe

    assert describe(KeyError("x")) is None
