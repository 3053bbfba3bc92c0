"""Every table has one owner: SQL that names a table stands in its owner or in a reader `infra.tables` declares.

What counts as naming a table: an SQL string constant (str or bytes, wherever it stands, f-string parts
included) with the table after FROM, JOIN, INTO, UPDATE, TABLE, TRUNCATE, EXISTS or LIKE; a literal
`sql.SQL("t")` or `sql.Identifier("t")`; a module-level constant that is the table's name (or holds it in a
tuple), which is how dynamic SQL names a table. The rule is checked both ways: a module outside the data
fails, and so does an owner or reader listed for a table it no longer names (the data stays true).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from infra.tables import TABLES, VECTOR_TABLE_PREFIX, VECTOR_TABLES, Table

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "command_handler", "projector", "indexer", "subscriptions", "query", "retention",
            "pamledger_client", "mcp_binding", "pamledger", "infra", "authz", "embedding", "local_servers")
VECTORS = "<vector tables>"
DATA = "infra.tables"  # the ownership data names every table; it is not SQL
_STATEMENT = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|TRUNCATE|DROP|WITH|VACUUM)\b")
_NAMED = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE|TRUNCATE|EXISTS|LIKE)\s+(?:ONLY\s+)?([a-z_][a-z0-9_]*)",
                    re.IGNORECASE)


def tables_named(source: str, known: set[str]) -> set[str]:
    """The known tables a module's source names (see the module docstring), VECTORS for a vector table."""
    found: set[str] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        text = _text(node)
        if text is not None:
            if VECTOR_TABLE_PREFIX in text:
                found.add(VECTORS)
            if _STATEMENT.search(text):
                found |= {t for t in _NAMED.findall(text) if t in known}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("SQL", "Identifier") and node.args:
            found |= {t for t in [_text(node.args[0])] if t in known}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
            found |= {t for t in map(_text, values) if t in known}
    return found


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value.decode() if isinstance(node.value, bytes) else node.value
    return None


def module_names(root: Path) -> dict[str, Path]:
    return {".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
            for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def usage(root: Path, known: set[str]) -> dict[str, set[str]]:
    """table -> the modules whose source names it."""
    used: dict[str, set[str]] = defaultdict(set)
    for module, path in module_names(root).items():
        if module == DATA:
            continue
        for table in tables_named(path.read_text(), known):
            used[table].add(module)
    return used


def _covers(entry: str, module: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def trespasses(tables: dict[str, Table], used: dict[str, set[str]]) -> list[str]:
    """'module names table' for every module that is neither the table's owner nor a declared reader."""
    return sorted(f"{module} names {table}" for table, spec in tables.items() for module in used.get(table, ())
                  if module != spec.owner and not any(_covers(r, module) for r in spec.readers))


def stale(tables: dict[str, Table], used: dict[str, set[str]]) -> list[str]:
    """Owners and readers listed for a table none of their modules names any more."""
    return sorted(f"{entry} listed for {table}" for table, spec in tables.items()
                  for entry in [spec.owner, *spec.readers]
                  if not any(_covers(entry, module) for module in used.get(table, ())))


def _all_tables() -> dict[str, Table]:
    return {**TABLES, VECTORS: VECTOR_TABLES}


def test_sql_names_a_table_only_in_its_owner_or_a_declared_reader() -> None:
    tables = _all_tables()
    assert trespasses(tables, usage(ROOT, set(tables))) == []


def test_every_owner_and_reader_listed_still_names_its_table() -> None:
    tables = _all_tables()
    assert stale(tables, usage(ROOT, set(tables))) == []


def test_every_table_the_migrations_create_has_an_owner() -> None:
    created = {m.group(1) for path in (ROOT / "infra" / "sql").glob("*.sql")
               for m in re.finditer(r"CREATE TABLE (?:IF NOT EXISTS )?([a-z_]+)", path.read_text())}
    assert created - set(TABLES) == set()
    assert set(TABLES) - created == set()


def test_every_owner_and_reader_is_a_module_or_package() -> None:
    modules = set(module_names(ROOT))
    entries = {e for spec in _all_tables().values() for e in [spec.owner, *spec.readers]}
    assert sorted(e for e in entries if e not in modules) == []


def test_the_checker_finds_sql_outside_the_owner_in_every_form(tmp_path: Path) -> None:
    files = {
        "query/__init__.py": "",
        "query/a.py": 'Q = b"SELECT x FROM ledger WHERE p = %s"\n',
        "query/b.py": "from psycopg import sql\nq = sql.SQL('{}').format(sql.Identifier('scopes'))\n",
        "query/c.py": 'TABLES = ("content_store", "other")\n',
        "query/d.py": 'def f(k):\n    return f"DELETE FROM embedding_vectors_{k}"\n',
        "query/e.py": 'text = "the ledger and scopes, in prose"\nSELECT = "scopes"[0]\n',
        "infra/__init__.py": "", "infra/own.py": 'Q = "INSERT INTO ledger VALUES (1)"\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    tables = {"ledger": Table("infra.own"), "scopes": Table("infra.own"), "content_store": Table("infra.own"),
              VECTORS: Table("infra.own", {"query.z": "gone"})}
    used = usage(tmp_path, set(tables))
    assert trespasses(tables, used) == [
        "query.a names ledger", "query.b names scopes", "query.c names content_store", "query.d names " + VECTORS]
    assert stale(tables, used) == [
        "infra.own listed for " + VECTORS, "infra.own listed for content_store", "infra.own listed for scopes",
        "query.z listed for " + VECTORS]
    tables["ledger"] = Table("infra.own", {"query": "all of query"})
    assert "query.a names ledger" not in trespasses(tables, used)
