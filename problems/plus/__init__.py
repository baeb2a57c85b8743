"""HumanEval+-style test augmentation (EvalPlus, Liu et al. 2023): stronger tests built from a reference solution.

One job per module: ``inputs`` (seed inputs from a problem's ``check``), ``mutate`` (type-aware input
mutation), ``literals`` (plain data as Python source, and the float-tolerant comparison the tests use),
``runner`` (a trusted function on a batch of inputs in the sandbox), ``mutants`` (mutants of the reference),
``reduce`` (greedy set cover), ``augment`` (the whole per-problem recipe, and the augmented ``ExecProblem``).
Pure logic: no Prefect, no MLflow.
"""
