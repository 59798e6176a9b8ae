"""Executing generated code: the sandbox (``sandbox``: a child process with time and memory limits and no network)
and test suites run inside it (``testcases``: assert lists, HumanEval check functions, stdin/stdout and call-based
tests, with a result per test). Used by the code benchmarks (``rlexp.evaluation.checkers``) and by the code reward
(``rlexp.rewards.code``); imports nothing else of rlexp."""
