"""Every third-party module the service imports comes with what pyproject declares, so a wheel installed alone
works: psycopg_pool was imported by the query service and the gateway but only installed, in development,
by the bench extras (psycopg's `pool` extra was not asked for).

A module passes when its distribution is a declared dependency or one a declared dependency requires
(through the extras asked for, recursively, as installed here). The test and bench extras do not count.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = "client/pamledger_client"  # the pamledger-client distribution (client/pyproject.toml)
SHIPPED = ("schemas", "command_handler", "projector", "indexer", "subscriptions", "query", "retention",
           CLIENT, "mcp_binding", "pamledger", "infra", "authz", "embedding", "local_servers")
OURS = frozenset(Path(p).name for p in SHIPPED) | {"bench", "tests"}


def third_party_imports(root: Path, packages: tuple[str, ...] = SHIPPED) -> dict[str, set[str]]:
    """top-level module -> the shipped files importing it (stdlib and our packages left out)."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for module in modules:
                    top = module.split(".")[0]
                    if top not in OURS and top not in sys.stdlib_module_names and top != "__future__":
                        found.setdefault(top, set()).add(str(path.relative_to(root)))
    return found


def installed_closure(declared: list[str]) -> set[str]:
    """The distributions the declared requirements bring, with their extras, as installed here."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(d) for d in declared]
    names: set[str] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            found = requires(req.name) or []
        except PackageNotFoundError:
            continue
        for text in found:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return names


def undeclared(imports: dict[str, set[str]], closure: set[str]) -> list[str]:
    distributions = packages_distributions()
    return sorted(f"{top} ({sorted(files)[0]})" for top, files in imports.items()
                  if not {canonicalize_name(d) for d in distributions.get(top, [top])} & closure)


def test_every_imported_module_comes_with_the_declared_dependencies() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert undeclared(third_party_imports(ROOT), installed_closure(declared)) == []


def test_the_client_imports_only_what_its_own_distribution_declares() -> None:
    """pamledger-client installs alone: what it imports comes with its dependencies or, imported lazily where
    needed, with one of its extras (tests/unit/test_layers.py checks the laziness)."""
    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert [Requirement(d).name for d in project["dependencies"]] == ["nats-py", "msgspec"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    assert undeclared(third_party_imports(ROOT, (CLIENT,)), installed_closure(declared)) == []


def test_a_module_only_an_extra_brings_is_found() -> None:
    closure = installed_closure(["psycopg[binary]>=3.2"])
    assert "psycopg-pool" not in closure
    assert undeclared({"psycopg_pool": {"query/hybrid.py"}}, closure) == ["psycopg_pool (query/hybrid.py)"]
    assert undeclared({"psycopg_pool": {"query/hybrid.py"}}, installed_closure(["psycopg[binary,pool]>=3.2"])) == []


def test_the_license_pyproject_names_is_shipped_and_every_package_is_marked_typed() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert sorted(p for p in SHIPPED if not (ROOT / p / "py.typed").is_file()) == []
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())
    assert client["project"]["license-files"] == ["LICENSE"] and (ROOT / "client" / "LICENSE").read_text() == (
        ROOT / "LICENSE").read_text()
    assert client["project"]["version"] == project["project"]["version"]
    assert f"pamledger-client=={client['project']['version']}" in [d.split()[0] for d in project["project"]["dependencies"]]
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["*"]


def test_the_cli_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from pamledger.cli import main

    try:
        main(["--version"])
    except SystemExit as exited:
        assert exited.code == 0
    assert capsys.readouterr().out.strip() == f"pamledger {version('pamledger')}"
