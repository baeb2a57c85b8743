"""The one representation of an executable problem that the rewards, the suites and RL share; ``request`` makes
one completion of it the sandbox's ``JudgeRequest``.

Problem sets (HumanEval-format files, doctests mined from the corpus, the synthetic family) all become
``ExecProblem`` records. ``tests`` is a HumanEval-style program defining ``check(candidate)``: all-pass means
``check`` returns. ``test_cases`` are independent snippets in terms of ``candidate`` (``assert candidate(2, 3)
== 5``), each run on its own for partial credit; an empty list means partial credit equals the binary verdict.
``prompt`` is trusted problem data: the trusted side executes it too (HumanEval prompts define helpers such as
``poly`` or ``encode_cyclic`` that the tests call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codemill.sandbox.request import JudgeRequest


@dataclass(frozen=True)
class ExecProblem:
    problem_id: str
    prompt: str
    entry_point: str
    tests: str
    test_cases: list[str] = field(default_factory=list)
    reference_solution: str | None = None
    source: str = ""
    split_unit: str = ""

    def request(self, completion: str) -> JudgeRequest:
        """This problem completed by ``completion``, as the judge pool takes it: the candidate runs the prompt and
        the completion; the judge runs the prompt (trusted, for its helpers), the tests and each test case."""
        return JudgeRequest(program=self.prompt + completion, entry_point=self.entry_point, tests=self.tests,
                            test_cases=tuple(self.test_cases), prelude=self.prompt)

    def __hash__(self) -> int:  # the generated hash would fail on the list field
        return hash((self.problem_id, self.prompt, self.entry_point, self.tests, tuple(self.test_cases),
                     self.reference_solution, self.source, self.split_unit))
