"""The import rules between layers hold: no service imports another service, the SDK or the composition root;
the SDK (the pamledger-client distribution, client/) imports nothing of the server.

Why a test: the rules are what keeps the services replaceable (they meet only through NATS and the ledger);
an AST walk over every import (module level, function bodies, TYPE_CHECKING blocks) catches the lazy
imports that import-linter's static graph also sees, without adding a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = frozenset({"command_handler", "projector", "indexer", "query", "subscriptions", "retention"})
# The kernel's rooms: schemas (the vocabulary), infra (ledger, followers, requests, settings: the base),
# authz (policy, tokens, the grants read model, NATS users) and embedding (spaces, embedders, vectors).
KERNEL = frozenset({"schemas", "infra", "authz", "embedding"})
LOCAL_SERVERS = "local_servers"  # development NATS and Postgres: only the composition root starts servers
SDK = "pamledger_client"  # client/pamledger_client: a distribution of its own, installed alone by agents
# The SDK's wire vocabulary (subjects, headers, error codes, canonical JSON, value checks): the server reads the
# protocol from there, so every layer may import it; nothing else of the SDK.
PROTOCOL = f"{SDK}.protocol"
WHERE = {SDK: Path("client") / SDK}  # packages not at the root
BINDING = "mcp_binding"  # the MCP binding: a client of the service through the SDK, like the CLI
COMPOSITION_ROOT = "pamledger"
# What each layer may import among our own packages (third-party packages are not ruled here).
ALLOWED: dict[str, frozenset[str]] = {
    "schemas": frozenset({"schemas"}),
    "infra": frozenset({"schemas", "infra"}),
    "authz": frozenset({"schemas", "infra", "authz"}),
    "embedding": frozenset({"schemas", "infra", "embedding"}),
    LOCAL_SERVERS: KERNEL | {LOCAL_SERVERS},
    SDK: frozenset({SDK, PROTOCOL}),
    BINDING: KERNEL | {SDK, BINDING},
    COMPOSITION_ROOT: KERNEL | SERVICES | {SDK, BINDING, COMPOSITION_ROOT, LOCAL_SERVERS},
    **{service: KERNEL | {service} for service in SERVICES},
}
OURS = frozenset(ALLOWED) | {"bench", "soak", "tests"}  # dev tools beside the layers: may import any


def imports_of(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the module, wherever it stands, and of every
    `importlib.import_module("x...")` / `__import__("x...")` with a literal name; an import of the SDK's
    protocol is named `pamledger_client.protocol`."""
    return [(line, _layer_of(module)) for line, module in modules_imported(source)]


def modules_imported(source: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and _dynamic_import(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value))
    return found


def _layer_of(module: str) -> str:
    return PROTOCOL if module == PROTOCOL or module.startswith(PROTOCOL + ".") else module.split(".")[0]


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
        for path in sorted((root / WHERE.get(package, Path(package))).rglob("*.py")):
            for line, target in imports_of(path.read_text()):
                if target == PROTOCOL:
                    continue  # every layer may read the protocol
                if target.split(".")[0] in OURS and target not in allowed:
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
        "client/pamledger_client/c.py": "from pamledger_client.protocol.subjects import command_subject\n",
        "schemas/p.py": "from pamledger_client.protocol.errors import ErrorCode\n",
        "pamledger/r.py": "from query.service import QueryService\nfrom pamledger_client import cli\n",
    })
    assert crossings(root) == []


def test_the_checker_finds_a_service_importing_another_even_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"query/a.py": "def f():\n    from projector.store import checkpoint\n"})
    assert crossings(root) == ["query/a.py:2 -> projector"]


def test_the_checker_finds_imports_under_type_checking(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"subscriptions/g.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pamledger_client.client\n")})
    assert crossings(root) == ["subscriptions/g.py:3 -> pamledger_client"]


def test_the_checker_holds_the_kernel_and_the_sdk_to_their_rules(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "schemas/s.py": "from infra.settings import Settings\n",
        "infra/runtime.py": "from command_handler.writer import Writer\n",
        "client/pamledger_client/cli.py": ("from pamledger.cli import main\nfrom query.request import QueryRequest\n"
                                           "from infra.settings import Settings\n"),
        "infra/client.py": "from pamledger_client.client import MemoryClient\n",
    })
    assert crossings(root) == [
        "infra/client.py:1 -> pamledger_client", "infra/runtime.py:1 -> command_handler",
        "client/pamledger_client/cli.py:1 -> pamledger", "client/pamledger_client/cli.py:2 -> query",
        "client/pamledger_client/cli.py:3 -> infra", "schemas/s.py:1 -> infra",
    ]


def test_the_mcp_binding_never_touches_postgres() -> None:
    """The MCP server talks to the service only through the SDK over NATS (it runs wherever an agent runs)."""
    reached = {target for path in (ROOT / BINDING).rglob("*.py") for _, target in imports_of(path.read_text())}
    assert not reached & {"psycopg", "psycopg_pool", "infra.ledger"}, reached
    assert "pamledger_client" in reached


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


def test_the_client_distribution_imports_only_nats_py_msgspec_and_itself() -> None:
    """pamledger-client depends on nats-py and msgspec only (client/pyproject.toml): every module imports the
    standard library, those two and itself; bcrypt (`admin` extra) and OpenTelemetry (`tracing` extra) only
    inside the function that needs them, so importing any module works without them."""
    lazy = {"bcrypt", "opentelemetry"}
    for path in (ROOT / WHERE[SDK]).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.split(".")[0]]
            else:
                continue
            for name in names:
                if name in sys.stdlib_module_names or name in {"nats", "msgspec", SDK}:
                    continue
                assert name in lazy and node.col_offset > 0, f"{path.name}:{node.lineno} imports {name}"


def test_the_checker_keeps_the_kernel_rooms_and_the_local_servers_apart(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "infra/shell.py": "from authz.policy import decide\nfrom embedding.store import SpaceRow\n",
        "authz/p.py": "from infra.settings import Settings\nfrom embedding.known import embedder_for\n",
        "embedding/k.py": "from infra.settings import Settings\nfrom schemas.embedding import same_space\n",
        "query/s.py": "from authz.policy import decide\nfrom local_servers.launch import up\n",
        "client/pamledger_client/c.py": "from local_servers.launch import up\n",
        "pamledger/r.py": "from local_servers.launch import up\n",
    })
    assert crossings(root) == [
        "authz/p.py:2 -> embedding", "infra/shell.py:1 -> authz", "infra/shell.py:2 -> embedding",
        "client/pamledger_client/c.py:1 -> local_servers", "query/s.py:2 -> local_servers",
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
    assert found["include"] == ["*"] and found["exclude"] == ["tests", "tests.*", "client", "client.*"]
    skipped = {".venv", "tests", ".git", "build", "tracemalloc_hook"}  # the hook is a sitecustomize, not a package
    folders = {p.parent for p in ROOT.glob("**/*.py") if not skipped & set(p.relative_to(ROOT).parts)
               and p.parent != ROOT}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists()) == []
