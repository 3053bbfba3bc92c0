"""The import rules between layers hold: no service imports another service, the SDK or the composition root.

Why a test: the rules are what keeps the services replaceable (they meet only through NATS and the ledger);
an AST walk over every import (module level, function bodies, TYPE_CHECKING blocks) catches the lazy
imports that import-linter's static graph also sees, without adding a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = frozenset({"command_handler", "projector", "indexer", "query", "subscriptions", "retention"})
# The kernel's rooms: schemas (the vocabulary), infra (ledger, followers, requests, settings: the base),
# authz (policy, tokens, the grants read model, NATS users) and embedding (spaces, embedders, vectors).
KERNEL = frozenset({"schemas", "infra", "authz", "embedding"})
LOCAL_SERVERS = "local_servers"  # development NATS and Postgres: only the composition root starts servers
SDK = "memory_client"
BINDING = "mcp_binding"  # the MCP binding: a client of the service through the SDK, like the CLI
COMPOSITION_ROOT = "pamledger"
# What each layer may import among our own packages (third-party packages are not ruled here).
ALLOWED: dict[str, frozenset[str]] = {
    "schemas": frozenset({"schemas"}),
    "infra": frozenset({"schemas", "infra"}),
    "authz": frozenset({"schemas", "infra", "authz"}),
    "embedding": frozenset({"schemas", "infra", "embedding"}),
    LOCAL_SERVERS: KERNEL | {LOCAL_SERVERS},
    SDK: KERNEL | {SDK},
    BINDING: KERNEL | {SDK, BINDING},
    COMPOSITION_ROOT: KERNEL | SERVICES | {SDK, BINDING, COMPOSITION_ROOT, LOCAL_SERVERS},
    **{service: KERNEL | {service} for service in SERVICES},
}
OURS = frozenset(ALLOWED) | {"bench", "soak", "tests"}  # dev tools beside the layers: may import any


def imports_of(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the module, wherever it stands, and of every
    `importlib.import_module("x...")` / `__import__("x...")` with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and _dynamic_import(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def _dynamic_import(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("__import__", "import_module"))


def unclassified_packages(root: Path) -> list[str]:
    """Top-level packages (folders with an __init__.py) that no layer rule names: a new package must be
    placed in a layer before it can import anything, or it would carry imports between services."""
    return sorted(path.parent.name for path in root.glob("*/__init__.py") if path.parent.name not in OURS)


def crossings(root: Path) -> list[str]:
    """Every import under `root` that breaks a layer rule, as 'path:line -> package'."""
    broken = []
    for package, allowed in sorted(ALLOWED.items()):
        for path in sorted((root / package).rglob("*.py")):
            for line, target in imports_of(path.read_text()):
                if target in OURS and target not in allowed:
                    broken.append(f"{path.relative_to(root)}:{line} -> {target}")
    return broken


def test_no_import_crosses_a_layer() -> None:
    assert crossings(ROOT) == []


def test_every_top_level_package_is_placed_in_a_layer() -> None:
    assert unclassified_packages(ROOT) == []


def test_the_checker_finds_an_unplaced_package_and_a_dynamic_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "grants/__init__.py": "", "query/__init__.py": "",
        "query/a.py": "import importlib\nm = importlib.import_module('projector.store')\n",
    })
    assert unclassified_packages(root) == ["grants"]
    assert crossings(root) == ["query/a.py:2 -> projector"]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checker_allows_the_kernel_and_own_package(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "query/a.py": "import msgspec\nfrom infra.settings import Settings\nfrom query import b\nimport schemas.errors\n",
        "infra/x.py": "from schemas.canonical import canonical_bytes\n",
        "memory_client/c.py": "from infra.subjects import command_subject\n",
        "pamledger/r.py": "from query.service import QueryService\nfrom memory_client import cli\n",
    })
    assert crossings(root) == []


def test_the_checker_finds_a_service_importing_another_even_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"query/a.py": "def f():\n    from projector.store import checkpoint\n"})
    assert crossings(root) == ["query/a.py:2 -> projector"]


def test_the_checker_finds_imports_under_type_checking(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"subscriptions/g.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import memory_client.client\n")})
    assert crossings(root) == ["subscriptions/g.py:3 -> memory_client"]


def test_the_checker_holds_the_kernel_and_the_sdk_to_their_rules(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "schemas/s.py": "from infra.settings import Settings\n",
        "infra/runtime.py": "from command_handler.writer import Writer\n",
        "memory_client/cli.py": "from pamledger.cli import main\nfrom query.request import QueryRequest\n",
    })
    assert crossings(root) == [
        "infra/runtime.py:1 -> command_handler", "memory_client/cli.py:1 -> pamledger",
        "memory_client/cli.py:2 -> query", "schemas/s.py:1 -> infra",
    ]


def test_the_mcp_binding_never_touches_postgres() -> None:
    """The MCP server talks to the service only through the SDK over NATS (it runs wherever an agent runs)."""
    reached = {target for path in (ROOT / BINDING).rglob("*.py") for _, target in imports_of(path.read_text())}
    assert not reached & {"psycopg", "psycopg_pool", "infra.ledger"}, reached
    assert "memory_client" in reached


def test_the_relay_sits_beside_the_writer_and_gets_committed_rows_through_a_callback() -> None:
    """The relay is part of the write path (command_handler/relay.py), but the writer's core path does not
    import it: the composition root hands the writer the relay's `submit` as its `committed` callback."""
    assert (ROOT / "command_handler" / "relay.py").is_file()
    writer_imports = {module for module in _modules((ROOT / "command_handler" / "writer.py").read_text())}
    assert not any(module.endswith("relay") for module in writer_imports), writer_imports


def _modules(source: str) -> list[str]:
    return [alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
            for alias in node.names] + [node.module for node in ast.walk(ast.parse(source))
                                        if isinstance(node, ast.ImportFrom) and node.module]


def test_the_sdk_reads_no_table() -> None:
    """The SDK's client (everything but the CLI's operator tooling, `cli*.py`) reaches the service only over
    NATS: listing subscriptions is the gateway's `sub.list`, not a read of its table."""
    for path in (ROOT / "memory_client").rglob("*.py"):
        reached = {target for _, target in imports_of(path.read_text())}
        if path.name.startswith("cli"):
            continue
        assert not reached & {"psycopg", "psycopg_pool", "infra.ledger"}, (path.name, reached)
    subscribe_cli = (ROOT / "memory_client" / "cli_subscribe.py").read_text()
    assert "psycopg" not in subscribe_cli and "FROM subscriptions" not in subscribe_cli


def test_the_checker_keeps_the_kernel_rooms_and_the_local_servers_apart(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "infra/shell.py": "from authz.policy import decide\nfrom embedding.store import SpaceRow\n",
        "authz/p.py": "from infra.settings import Settings\nfrom embedding.known import embedder_for\n",
        "embedding/k.py": "from infra.settings import Settings\nfrom schemas.embedding import same_space\n",
        "query/s.py": "from authz.policy import decide\nfrom local_servers.launch import up\n",
        "memory_client/c.py": "from local_servers.launch import up\n",
        "pamledger/r.py": "from local_servers.launch import up\n",
    })
    assert crossings(root) == [
        "authz/p.py:2 -> embedding", "infra/shell.py:1 -> authz", "infra/shell.py:2 -> embedding",
        "memory_client/c.py:1 -> local_servers", "query/s.py:2 -> local_servers",
    ]


def test_only_the_composition_root_starts_local_servers() -> None:
    """A deployed service connects to the servers it is given; starting them is the composition root's."""
    importers = {path.relative_to(ROOT).parts[0] for package in ALLOWED if package != LOCAL_SERVERS
                 for path in (ROOT / package).rglob("*.py")
                 if any(target == LOCAL_SERVERS for _, target in imports_of(path.read_text()))}
    assert importers == {COMPOSITION_ROOT}


IO_LIBRARIES = frozenset({"psycopg", "psycopg_pool", "nats", "asyncio", "socket", "subprocess", "os", "time",
                          "uuid", "secrets", "random", "threading"})


def core_trespasses(root: Path) -> list[str]:
    """Imports of an I/O library or of the writer's shell by a module of command_handler/core/."""
    found = []
    for path in sorted((root / "command_handler" / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                if name.split(".")[0] in IO_LIBRARIES or (
                        name.startswith("command_handler.") and not name.startswith("command_handler.core")):
                    found.append(f"{path.relative_to(root)}:{node.lineno} -> {name}")
    return found


def test_the_writers_core_does_no_io_and_imports_no_shell() -> None:
    assert core_trespasses(ROOT) == []


def test_the_core_checker_finds_io_and_the_shell(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"command_handler/core/a.py": (
        "import asyncio\nfrom command_handler.store import Batch\nfrom command_handler.core.chain import row_hash\n"
        "from schemas.errors import InvalidRequest\nfrom psycopg import sql\n")})
    assert core_trespasses(root) == ["command_handler/core/a.py:1 -> asyncio",
                                     "command_handler/core/a.py:2 -> command_handler.store",
                                     "command_handler/core/a.py:5 -> psycopg"]


def test_every_package_is_in_the_wheel() -> None:
    """pyproject finds packages (every folder with __init__.py but tests); a folder of Python modules without
    __init__.py would be missing from a built wheel, though an editable install (which every test here uses)
    still finds it. tests/integration/test_wheel.py installs the wheel for real."""
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["*"] and found["exclude"] == ["tests", "tests.*"]
    skipped = {".venv", "tests", ".git", "build", "tracemalloc_hook"}  # the hook is a sitecustomize, not a package
    folders = {p.parent for p in ROOT.glob("**/*.py") if not skipped & set(p.relative_to(ROOT).parts)
               and p.parent != ROOT}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []
