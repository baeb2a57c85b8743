"""Running untrusted, model-written programs: bubblewrap isolation plus rlimits and a wall clock."""

from codemill.sandbox.limits import Limits
from codemill.sandbox.runner import ExecResult, Outcome, Sandbox, SandboxUnavailable

__all__ = ["ExecResult", "Limits", "Outcome", "Sandbox", "SandboxUnavailable"]
