"""The Python and calculator tools, run for real (issue 28): results, errors returned as text, limits."""

from __future__ import annotations

import pytest

from rlexp.tools import clip_text
from rlexp.tools.calculator import CalculatorTool
from rlexp.tools.python import PythonTool


def test_python_runs_in_the_sandbox_and_returns_what_it_printed():
    tool = PythonTool()
    assert tool({"code": "x = 6\nprint(x * 7)"}).text == "42"
    res = tool({"code": "print('before')\n1 / 0"})
    assert res.error and res.text == "before\nZeroDivisionError: division by zero"
    assert tool({"code": "y = 1"}).text == "(no output: print the result)"
    bad = tool({"source": "print(1)"})
    assert bad.error and "needs a non-empty string argument `code`" in bad.text


def test_python_network_is_off_and_time_is_limited():
    tool = PythonTool(timeout=1.0)
    net = tool({"code": "import socket\nsocket.create_connection(('example.com', 80))"})
    assert net.error and "network" in net.text.lower()
    slow = tool({"code": "while True:\n    pass"})
    assert slow.error and "timed out after 1 s" in slow.text


def test_calculator_evaluates_arithmetic_and_refuses_the_rest():
    calc = CalculatorTool()
    assert calc({"expression": "3 * (4 + 5)"}).text == "27"
    assert calc({"expression": "7 / 2"}).text == "3.5"
    assert calc({"expression": "-2 ** 3 + 10 // 3 % 2"}).text == "-7"  # -(2**3) + (3 % 2)
    assert calc({"expression": "1 / 0"}).text == "calculator: division by zero"
    for bad in ("__import__('os')", "2 ** 1000", "x + 1", "1 +"):
        assert calc({"expression": bad}).error, bad


def test_clip_text_says_what_it_cut():
    assert clip_text("abcdef", 4) == "abcd... [2 more characters cut]" and clip_text("abc", 4) == "abc"


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="tool python: timeout and memory_mb must be > 0"):
        PythonTool(timeout=0)


def test_python_echoes_a_last_bare_expression_as_a_notebook_cell_does():
    from rlexp.tools.python import echo_last_expression

    tool = PythonTool()
    assert tool({"code": "482 * 317"}).text == "152794"
    assert tool({"code": "x = 3\nx * 2"}).text == "6"
    assert tool({"code": "'ab'"}).text == "'ab'"  # the value's repr, as the REPL shows it
    assert tool({"code": "print(5)"}).text == "5"  # print's None is not echoed
    assert tool({"code": "x = 1"}).text == "(no output: print the result)"
    assert echo_last_expression("def f(:") == "def f(:"  # does not parse: run as written, its error comes back
    assert PythonTool(echo_last_expression=False)({"code": "482 * 317"}).text == "(no output: print the result)"
