"""The suite's closing lines (tests/conftest.py) name what ran: the whole suite, or the subset chosen."""
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_the_closing_line_names_the_subset_that_ran(pytester):
    pytester.makeini('[pytest]\ntestpaths = tests\nmarkers =\n    slow: slow\n    cuda: cuda\n')
    tests = pytester.mkdir("tests")
    (tests / "conftest.py").write_text(CONFTEST.read_text())
    (tests / "test_two.py").write_text("import pytest\n\ndef test_fast():\n    pass\n\n"
                                       "@pytest.mark.slow\ndef test_slow():\n    pass\n")
    lines = {args: [line for line in pytester.runpytest_inprocess(*args).outlines if " s (" in line][-1]
             for args in [(), ("-m", "not slow"), ("tests/test_two.py", "-k", "fast")]}
    assert lines[()].startswith("whole suite: 0 s (0.0 min) in 2 tests"), lines
    assert lines[("-m", "not slow")].startswith('this run (-m "not slow", 1 deselected): 0 s (0.0 min) in 1 tests')
    assert lines[("tests/test_two.py", "-k", "fast")].startswith('this run (tests/test_two.py, -k "fast", 1 deselected)')
