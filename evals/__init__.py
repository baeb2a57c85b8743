"""codemill.evals: evaluation suites, statistics and the gate. No Prefect here."""
