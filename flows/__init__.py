"""codemill.flows: Prefect flows (pipeline, and later nightly, evaluate, one per stage)."""
