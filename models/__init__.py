"""codemill.models: model construction, the torchrun trainer, checkpoints, export. No Prefect here."""
