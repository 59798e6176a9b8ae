"""A Python interpreter tool: the model's code runs in rlexp's sandbox (``rlexp.execution.sandbox``: a fresh
isolated child process, time and memory limits, no network) and what it printed comes back. With
``echo_last_expression`` (default) it answers as a notebook cell or the REPL does: a last statement that is a bare
expression has its value printed (``482 * 317`` shows 152794), so a model need not remember ``print``."""

from __future__ import annotations

import ast

from rlexp.core.registry import TOOLS
from rlexp.execution.sandbox import run_program
from rlexp.tools import ToolResult, clip_text


@TOOLS.register
class PythonTool:
    """Run Python code in the sandbox; its standard output (or its error) is the result."""

    tag_argument = "code"

    def __init__(
        self,
        name: str = "python",
        timeout: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 1000,
        echo_last_expression: bool = True,
    ):
        if timeout <= 0 or memory_mb <= 0:
            raise ValueError(f"tool {name}: timeout and memory_mb must be > 0, got {timeout}, {memory_mb}")
        self.name, self.timeout, self.memory_mb, self.max_output_chars = name, timeout, memory_mb, max_output_chars
        self.echo = echo_last_expression
        self.description = (
            f'{name}: runs Python code and returns what it prints (arguments: {{"code": <source>}}; '
            f"{timeout:g} s limit, no network)"
        )

    def __call__(self, arguments: dict) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(f"{self.name}: needs a non-empty string argument `code`", error=True)
        res = run_program(echo_last_expression(code) if self.echo else code, self.timeout, self.memory_mb)
        out = res.stdout.decode(errors="replace")
        if res.returncode is None or res.timed_out:
            return ToolResult(clip_text(out + f"\n[timed out after {self.timeout:g} s]", self.max_output_chars), True)
        if res.returncode != 0:
            lines = [ln for ln in res.stderr.decode(errors="replace").strip().splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {res.returncode}"
            return ToolResult(clip_text((out.rstrip("\n") + "\n" if out else "") + why, self.max_output_chars), True)
        return ToolResult(clip_text(out.rstrip("\n") or "(no output: print the result)", self.max_output_chars))


def echo_last_expression(code: str) -> str:
    """``code`` with its last statement printed when that statement is a bare expression whose value is not None
    (as a notebook cell shows it); code that does not parse is returned as is (its SyntaxError comes back)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    show = ast.parse("__rlexp_v = None\nif __rlexp_v is not None:\n    print(repr(__rlexp_v))").body
    show[0].value = last.value
    tree.body[-1:] = show
    return ast.unparse(ast.fix_missing_locations(tree))
