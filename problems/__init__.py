"""codemill.problems: executable problems (prompt, entry point, tests, reference) from HumanEval-format files,
mined doctests and the synthetic family, verified in the sandbox; and their augmented tests. No Prefect here."""
