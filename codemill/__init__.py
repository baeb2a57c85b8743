"""codemill: turn a code corpus into evaluated model checkpoints with full lineage."""

__version__ = "0.1.0"
