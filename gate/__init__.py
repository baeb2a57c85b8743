"""The regression gate in one place: is a candidate model worse than the reference on the same items?

Two steps, which the gate task (candidate vs champion) and ``codemill compare`` (a vs b) both take:
``evidence.collect`` gathers the paired item scores per metric and the noise source with its provenance (a
calibration in the store, the noise a preset ships, or none: the uncalibrated hold margins), then
``policy.decide`` says promote, hold or regression, with the reason and the advice line. ``noise`` is the model of
training noise the tests use, ``scores`` averages seeds' scores and measures their noise, ``calibration`` and
``preset_noise`` find a reference's seed noise, ``report`` renders a verdict, ``config`` is the pipeline's ``gate``
section. Pure: no Prefect, no MLflow.

This module imports none of them: ``codemill.config`` imports ``gate.config`` alone, not the statistics.
"""
