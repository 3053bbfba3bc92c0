"""`python -m bench NAME [ARGS]`: every benchmark is listed, a name reaches its own main, an unknown one exits 2.

Why a test: the entry is the only way in, so a benchmark missing from its table cannot be run at all. No
server starts: each benchmark is only asked for `--help`, which its argparse answers before doing anything.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as entry

BENCH = Path(entry.__file__).resolve().parent


def _main_takes_argv(path: Path) -> bool:
    """A benchmark's module defines `main(argv)`; a child process's (echo, naive, ...) takes none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            return [a.arg for a in node.args.args][:1] == ["argv"]
    return False


def test_every_module_with_a_main_taking_arguments_is_a_listed_benchmark() -> None:
    found = {p.stem for p in BENCH.glob("*.py") if p.name != "__main__.py" and _main_takes_argv(p)}
    assert found == set(entry.BENCHMARKS)
    assert entry.DEFAULT == "write_path" in entry.BENCHMARKS


def test_the_listing_names_every_benchmark_with_what_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name, what in entry.BENCHMARKS.items():
        assert f"  {name}  " in listed and what in listed


@pytest.mark.parametrize("name", sorted(entry.BENCHMARKS))
def test_a_name_reaches_the_options_of_its_own_module(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        entry.main([name, "--help"])
    assert exited.value.code == 0
    usage = capsys.readouterr().out.splitlines()[0]
    assert usage.startswith("usage: python -m bench ") and name in usage


def test_the_arguments_after_the_name_reach_its_main_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("bench.search")
    seen: list[Any] = []
    monkeypatch.setattr(module, "main", lambda argv: seen.append(argv) or 7)
    assert entry.main(["search", "--quick", "--mid", "3000"]) == 7
    assert seen == [["--quick", "--mid", "3000"]]


def test_no_name_runs_the_write_path_with_every_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("bench.write_path")
    seen: list[Any] = []
    monkeypatch.setattr(module, "main", lambda argv: seen.append(argv) or 0)
    assert entry.main(["--quick", "--only", "c"]) == 0
    assert entry.main([]) == 0
    assert seen == [["--quick", "--only", "c"], []]


@pytest.mark.parametrize("name", ["m2", "write-path", "c"])
def test_an_unknown_name_is_refused_with_the_list_and_exit_2(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main([name, "--quick"]) == 2
    refused = capsys.readouterr().err
    assert f"unknown benchmark {name!r}" in refused and all(n in refused for n in entry.BENCHMARKS)
