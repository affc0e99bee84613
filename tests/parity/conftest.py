"""pytest glue for the parity tests.

Contract:
  * tests/parity is importable (reference_transformer, mmtrain_util, config_io), in this
    process and in the ranks torch.multiprocessing spawns (they inherit sys.path).
  * fixture `mmtrain_bin`: the mmtrain executable from $MMTRAIN_BIN. Tests using it SKIP only
    when the variable is unset or names no file (scripts/run_tests.sh sets it to
    build/bin/mmtrain); a file that is there but not executable fails the test.
  * fixture `parity_report`: report(line) prints the line now and again in pytest's terminal
    summary, so the parity figures show even in a quiet (-q, captured) run.
"""
import os
import sys

import pytest

PARITY_DIR = os.path.dirname(os.path.abspath(__file__))
if PARITY_DIR not in sys.path:
    sys.path.insert(0, PARITY_DIR)


@pytest.fixture(scope="session")
def mmtrain_bin() -> str:
    path = os.environ.get("MMTRAIN_BIN")
    if not path:
        pytest.skip("MMTRAIN_BIN is not set: run through scripts/run_tests.sh, which sets it to build/bin/mmtrain")
    if not os.path.isfile(path):
        pytest.skip(f"MMTRAIN_BIN={path} does not exist: build mmtrain first (make build)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"MMTRAIN_BIN={path} is not executable")
    return os.path.abspath(path)


_REPORT_LINES: list[str] = []


@pytest.fixture
def parity_report():
    def report(line: str) -> None:
        print(line)
        _REPORT_LINES.append(line)
    return report


def pytest_terminal_summary(terminalreporter):
    if _REPORT_LINES:
        terminalreporter.section("parity figures")
        for line in _REPORT_LINES:
            terminalreporter.write_line(line)
