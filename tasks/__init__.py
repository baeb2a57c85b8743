"""codemill.tasks: Prefect tasks, thin wrappers over data/models/evals that cache, store and log lineage."""
