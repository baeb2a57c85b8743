"""The repo environment's chat format: ChatML messages, tool results as the next user message, and a turn's end
closed exactly once."""

from codemill.repos.task import RepoTask
from codemill.rl.envs.repo import RepoProblem, brief_tools, messages, observation_text, render_chatml

TASK = RepoTask("demo-1", "demo", "0" * 40, "clamp(50, 0, 10) returns 0.", "", "", ("t::a",), (), "")


def test_the_prompt_is_chatml_with_the_assistant_turn_open():
    text = render_chatml(messages(RepoProblem.of(TASK, "/nowhere"), "brief"))  # type: ignore[arg-type]
    assert text.startswith("<|im_start|>system\nYou are fixing an issue")
    assert "<|im_start|>user\nclamp(50, 0, 10) returns 0.<|im_end|>\n" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "- edit(path, old?, new): " in brief_tools() and "- submit(): " in brief_tools()


def test_a_turn_is_closed_once_whether_or_not_its_tokens_closed_it():
    results = "<tool_response>\n{}\n</tool_response>\n"
    closed = observation_text("<tool_call>...</tool_call>\n<|im_end|>", results)
    merged = observation_text("<tool_call>...</tool_call>\n<|im_end|><|", results)  # a token ran past the stop
    open_turn = observation_text("<tool_call>...</tool_call>\nand then", results)  # cut at max_new_tokens
    assert closed == merged == f"\n<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n"
    assert open_turn == f"<|im_end|>\n<|im_start|>user\n{results}<|im_end|>\n<|im_start|>assistant\n"
