"""How tool calls and their results look in the token stream: JSON tool calls in the Hermes / Qwen style.

A model turn carries zero or more calls, each a JSON object between tags::

    <tool_call>
    {"name": "read_file", "arguments": {"path": "mathlib/ops.py", "start": 1, "end": 40}}
    </tool_call>

and the environment answers every call of the turn, in call order::

    <tool_response>
    {"name": "read_file", "content": "1: ..."}
    </tool_response>

The tags and JSON are what Qwen2.5/Qwen3 and Hermes chat templates render for tools, so common tokenisers split
them cleanly. Another format is one more module with the same three functions (``parse``, ``render``,
``describe_tools``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # a call that could not be read: answered with this error, never run


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    error: bool = False
    duration_s: float = 0.0


def parse(text: str) -> list[ToolCall]:
    """Every tool call in a model turn, in order; a malformed one becomes a call carrying its error."""
    calls = []
    for match in CALL.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError as e:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON: {e}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCall("", error='a tool call is {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models encode the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict):
            calls.append(ToolCall(obj["name"], error="arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls


def render(results: Sequence[ToolResult]) -> str:
    """The environment's answer to a turn's calls, in call order."""
    return "".join(f"<tool_response>\n{json.dumps({'name': r.name, 'content': r.content})}\n</tool_response>\n"
                   for r in results)


def render_call(name: str, **arguments: Any) -> str:
    """One call as a model writes it (scripted agents and tests)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>\n"


def describe_tools(specs: Sequence[dict[str, Any]]) -> str:
    """The tools block of a system prompt, as Hermes / Qwen templates write it."""
    body = "\n".join(json.dumps({"type": "function", "function": s}) for s in specs)
    return ("You may call one or more functions. The functions are listed in <tools></tools>:\n<tools>\n" + body
            + "\n</tools>\nFor each call, return a JSON object with the function name and arguments within "
              "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call>")
