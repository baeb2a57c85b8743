"""Repository tasks: SWE-bench-format instances, their snapshots and execution environments, copy-on-write
workspaces, the tools an agent works with, bug-injection synthesis and the hardened grader.

Plain library code (no Prefect, no MLflow): ``codemill.tasks`` and ``codemill.flows`` wrap it into stages.
"""
