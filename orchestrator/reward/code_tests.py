"""`code_tests`: the fraction of a task's unit tests that the completion's Python code passes, in the sandbox.

The gold answer of a coding task holds its unit tests: a JSON list of test sources (MBPP's ``test_list``
as JSON), or one test per non-empty line (``assert f(2) == 5``; lines starting with ``#`` are skipped). The
completion's code is its last fenced block (```` ```python ````, ```` ```py ```` or a bare ```` ``` ````;
an unclosed last fence counts, the turn may have been cut off).

One sandboxed run per completion (orchestrator/reward/sandbox.py): the solution, then every test in its own
``try`` block that writes a marker line with a per-call random nonce when the test passed, so one failing test
does not hide the others. Reward = passed / tests. 0.0 when there is no code, the code does not compile, or
the run hit its wall or CPU limit (a timeout scores 0 even if some tests passed before it).

The tests run in the solution's interpreter: the sandbox contains the code, it does not make the reward
unhackable (a solution can return an object whose ``__eq__`` is always True, or read the nonce from its own
code object); an early ``sys.exit(0)``/``os._exit(0)`` passes nothing. docs/sandbox.md has the details.

Try it::

    code_tests(["```python\\ndef f(x):\\n    return x + 1\\n```"], ["assert f(1) == 2\\nassert f(2) == 4"])  # [0.5]
"""
from __future__ import annotations

import ast
import json
import re
import secrets
import textwrap
import warnings

from orchestrator.reward.sandbox import SandboxLimits, run_python

DEFAULT_LIMITS = SandboxLimits(cpu_s=2.0, wall_s=5.0, memory_mb=512, output_bytes=64 * 1024, file_mb=16)
_FENCE_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


class BadTestsError(ValueError):
    """A task's unit tests are malformed (a data error, not the policy's)."""


def extract_code(completion: str) -> str | None:
    """The last fenced Python (or untagged) code block of `completion`, or None when it has none."""
    blocks = [body for _, body in _FENCE_RE.findall(completion) if body.strip()]
    return blocks[-1] if blocks else None


def parse_tests(answer: str) -> list[str]:
    """The unit tests of a gold answer: a JSON list of strings, or one test per non-empty, non-# line.

    Raises BadTestsError when there is no test, a test does not compile, or a test holds no ``assert`` statement
    (naming it): a gold answer such as ``12`` compiles as an expression and would pass any code.
    """
    text = str(answer).strip()
    tests: list[str] | None = None
    if text.startswith("["):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError:
            loaded = None
        if isinstance(loaded, list) and all(isinstance(t, str) for t in loaded):
            tests = [t for t in loaded if t.strip()]
    if tests is None:
        tests = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not tests:
        raise BadTestsError(f"code_tests: the answer holds no unit test: {text[:80]!r}")
    for i, test in enumerate(tests):
        try:
            tree = ast.parse(textwrap.dedent(test), f"test {i}", "exec")
        except (SyntaxError, ValueError) as e:
            raise BadTestsError(f"code_tests: test {i} does not compile ({e}): {test[:80]!r}") from None
        if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
            raise BadTestsError(f"code_tests: test {i} has no assert statement: {test[:80]!r} (the gold answer must "
                                "be unit tests, e.g. data.source=code_arith)")
    return tests


def build_test_program(code: str, tests: list[str], nonce: str) -> str:
    """The program run in the sandbox: `code`, then each test in a try block printing ``<nonce> <i>`` on success."""
    parts = [code, "\n\nimport sys as _orch_sys\n"]
    for i, test in enumerate(tests):
        body = textwrap.indent(textwrap.dedent(test), "    ")
        parts.append(f"try:\n{body}\nexcept BaseException:\n    pass\n"
                     f"else:\n    _orch_sys.stdout.write('\\n{nonce} {i}\\n'); _orch_sys.stdout.flush()\n")
    return "".join(parts)


def score_code(code: str | None, tests: list[str], limits: SandboxLimits = DEFAULT_LIMITS) -> float:
    """Fraction of `tests` that `code` passes in one sandboxed run; 0.0 for no code, a syntax error or a timeout."""
    if code is None:
        return 0.0
    try:
        with warnings.catch_warnings():  # a SyntaxWarning of the model's code is not ours to print
            warnings.simplefilter("ignore")
            compile(code, "solution", "exec")
    except (SyntaxError, ValueError):
        return 0.0
    nonce = secrets.token_hex(12)
    result = run_python(build_test_program(code, tests, nonce), limits)
    if result.timed_out or result.limit_hit == "cpu":
        return 0.0
    passed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith(nonce + " ")}
    return len(passed & {str(i) for i in range(len(tests))}) / len(tests)


def code_tests(completions: list[str], answers: list[str]) -> list[float]:
    """Per completion, the fraction of its task's unit tests its code passes (see the module docstring).

    Args:
        completions: the completions of one group, length G.
        answers: their gold answers (the unit tests), length G.
    Returns:
        list[float] of length G, each in [0, 1].
    Raises:
        ValueError: the lengths differ; BadTestsError (a ValueError): an answer's tests are malformed.
    """
    if len(completions) != len(answers):
        raise ValueError(f"code_tests: got {len(completions)} completions and {len(answers)} answers")
    return [score_code(extract_code(c), parse_tests(a)) for c, a in zip(completions, answers)]
