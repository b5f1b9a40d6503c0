"""The unit's fields are one list (issue 40, docs/design.md §3 "One list of fields"): service/units.py's
STORED_FIELDS. Both dialects' schemas hold exactly its columns beside each store's own, every unit column a
statement of sql/ names is one of them, the statements that read and write a whole unit take them from
units.py, and every read answers every field on both stores."""
from __future__ import annotations

import re
import sqlite3

import pytest

from conftest import close_app, drain, make_unit, new_app, replayed
from service.adapters.conditions import UNIT_FIELDS as CONDITION_FIELDS
from service.config import Config
from service.readindex import schema as index_schema
from service.store.statements import expand, named, sql_file
from service.units import (DESCRIBING_FIELDS, KEPT_COLUMNS, MUTABLE_FIELDS, REPUSHED_COLUMNS, RESULT_COLUMNS,
                           SEARCHED_COLUMNS, STORED_COLUMNS, UNIT_COLUMNS, unit_dict, validate_unit)

BACKENDS = ("sqlite", "postgresql")
# What each store keeps in a unit's row beside the unit's own columns.
OWN_COLUMNS = {"sqlite": {"id", "pushed_ms", "indexed", "ntok", "tokens"}, "postgresql": {"tenant", "day", "pushed_ms"}}
SQL = {"sqlite": ("sqlite/shard_schema.sql", ("sqlite/shard_migrate_v2.sql", "sqlite/shard_migrate_v3.sql"),
                   "sqlite/*queries.sql"),
       "postgresql": ("postgresql/schema.sql", (), "postgresql/queries.sql")}


def table_columns(script: str, table: str) -> set[str]:
    """The columns a schema script gives ``table``: its CREATE TABLE and every ALTER TABLE ... ADD COLUMN."""
    script = re.sub(r"--[^\n]*", "", script)
    cols = set()
    m = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\)", script, flags=re.S)
    if m:
        for line in m.group(1).splitlines():            # one column (or constraint) a line
            words = line.split()
            if words and words[0].upper() not in ("PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "CONSTRAINT"):
                cols.add(words[0])
    cols |= set(re.findall(rf"ALTER TABLE {table} ADD COLUMN (?:IF NOT EXISTS )?(\w+)", script))
    return cols


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_units_table_holds_the_units_columns_and_the_stores_own(dialect):
    schema, migrations, _ = SQL[dialect]
    columns = table_columns(sql_file(schema), "units")
    assert columns == set(UNIT_COLUMNS) | OWN_COLUMNS[dialect]
    for script in migrations:              # an upgrade adds only what the schema has
        assert table_columns(sql_file(script), "units") <= columns


def test_postgresqls_unit_terms_hold_the_searched_columns():
    """A unit's terms row holds what a search filters and orders by (issue 52: the indexer listed them by hand)."""
    from service.store.postgresql.indexer import SEARCH_COLUMNS
    assert set(SEARCHED_COLUMNS) < set(UNIT_COLUMNS)
    assert table_columns(sql_file("postgresql/schema.sql"), "unit_terms") == {*SEARCH_COLUMNS, "ntok", "tfs"}
    assert set(SEARCH_COLUMNS) == {"tenant", "day", *SEARCHED_COLUMNS}


def test_postgresqls_indexer_writes_each_searched_column_as_the_unit_has_it(tmp_path, pg_urls):
    """The indexer's rows name no column in SQL (unit_terms_insert reads them by the table's own row type): an
    indexed unit's terms row holds every searched column as its units row has it, keys and lineage included."""
    import psycopg
    from psycopg.rows import dict_row
    from service.store.postgresql.indexer import SEARCH_COLUMNS
    app = new_app(tmp_path, store=pg_urls[0], store_replica=pg_urls[1])
    try:
        parent = make_unit("the parent words")
        child = make_unit("the child words", metadata={"project": "p1", "global": True, "session": 3},
                          parent_cid=validate_unit(parent, Config()).cid)
        rv = app.test_client().post("/mcp/push", json={"units": [parent, child]})
        assert rv.status_code == 200
        drain(app)
        with psycopg.connect(pg_urls[0], row_factory=dict_row) as c:
            terms = c.execute("SELECT * FROM unit_terms ORDER BY seq").fetchall()
            units = c.execute("SELECT * FROM units ORDER BY seq").fetchall()
    finally:
        close_app(app)
    assert len(terms) == len(units) == 2
    for term_row, unit_row in zip(terms, units):
        assert set(term_row) == {*SEARCH_COLUMNS, "ntok", "tfs"}
        assert {k: term_row[k] for k in SEARCH_COLUMNS} == {k: unit_row[k] for k in SEARCH_COLUMNS}
        assert term_row["ntok"] > 0 and set(term_row["tfs"]) and term_row["tenant"]
    assert terms[1]["parent_cid"] == units[0]["cid"] and terms[1]["project"] == "p1" and terms[1]["is_global"]


def test_sqlites_schema_script_makes_that_table():
    conn = sqlite3.connect(":memory:")
    conn.executescript(sql_file("sqlite/shard_schema.sql"))
    assert {r[1] for r in conn.execute("PRAGMA table_info(units)")} == set(UNIT_COLUMNS) | OWN_COLUMNS["sqlite"]


def unit_aliases(statement: str) -> set[str]:
    """The names a statement reads the units table by: ``units`` itself, an alias (``units u``), a lateral
    subquery over it (``(SELECT ... FROM units ...) u``)."""
    names = {"units"} if re.search(r"\b(FROM|JOIN|INTO|UPDATE)\s+units\b", statement) else set()
    names |= set(re.findall(r"\b(?:FROM|JOIN)\s+units\s+(?:AS\s+)?(\w+)", statement))
    names |= set(re.findall(r"\(\s*SELECT\b[^()]*\bFROM\s+units\b[^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:AS\s+)?(\w+)",
                            statement))
    return names - {"WHERE", "ON", "ORDER", "GROUP", "LIMIT", "SET"}


def test_every_sqlite_statement_compiles_against_the_schemas():
    """Each named statement of sql/sqlite/*queries.sql, as it runs (its @lists written out), is one SQLite prepares
    against the schema of one of the files (a unit column it names that the day file lacks would not be)."""
    dbs = []
    for script in ("shard_schema.sql", "catalog_schema.sql", "events_schema.sql", "registry_schema.sql",
                   "streams_schema.sql"):
        conn = sqlite3.connect(":memory:")
        conn.executescript(sql_file(f"sqlite/{script}"))
        if script == "shard_schema.sql":             # (backup compares a day file with its catalog, attached)
            conn.execute("ATTACH ':memory:' AS cat")
            conn.executescript(sql_file("sqlite/catalog_schema.sql").replace("IF NOT EXISTS ", "IF NOT EXISTS cat."))
        dbs.append(conn)
    statements = named("sqlite/*queries.sql", "sqlite")
    assert len(statements) > 60 and [n for n, s in statements.items() if re.search(r"@\w", s)] == []
    refused = {}
    for name, statement in statements.items():
        params = {p: None for p in re.findall(r":(\w+)", statement)}
        errors = []
        for conn in dbs:
            try:
                conn.execute("EXPLAIN " + statement, params)
                break
            except sqlite3.Error as e:
                errors.append(str(e))
        else:
            refused[name] = errors
    assert refused == {}


def test_every_unit_column_a_postgresql_statement_names_is_one_of_them():
    """``u.x`` where ``u`` stands for the units table (an alias, a lateral subquery over it), in every named
    statement as it runs: a column of its schema, so of units.py or the store's own; no @list left unwritten."""
    columns = set(UNIT_COLUMNS) | OWN_COLUMNS["postgresql"]
    statements = named("postgresql/queries.sql", "postgresql")
    assert [n for n, s in statements.items() if re.search(r"@\w", s)] == []
    unknown, seen = {}, 0
    for name, statement in statements.items():
        for alias in unit_aliases(statement) - {"units"}:
            named_cols = set(re.findall(rf"\b{alias}\.(\w+)", statement))
            seen += len(named_cols)
            if named_cols - columns:
                unknown[name] = sorted(named_cols - columns)
    assert unknown == {} and seen > 40


def written(statement: str, table: str) -> tuple[list[str], list[str]]:
    """(the columns an INSERT INTO table names, the columns an UPDATE of it or an upsert's conflict branch sets)."""
    ins = re.search(rf"INSERT INTO {table}\s*\(([^)]*)\)", statement)
    assignments = re.split(r"\bWHERE\b", statement.split("SET", 1)[1])[0] if "SET" in statement else ""
    sets = re.findall(r"\b(\w+)\s*=\s*(?:excluded\.\w+|%\(\w+\)s|:\w+)", assignments) \
        if re.search(rf"(UPDATE {table} SET|ON CONFLICT\(cid\) DO UPDATE SET)", statement) else []
    return ([c.strip() for c in ins.group(1).split(",")] if ins else []), sets


def test_the_statements_that_write_a_unit_write_each_column():
    """A new unit's row names every column (the store's own beside); a re-push, in both stores' rows and in
    PostgreSQL's queue and terms rows (which hold the columns search filters on), sets what a re-push writes
    (units.py REPUSHED_COLUMNS) and only that."""
    sqlite, pg = named("sqlite/*queries.sql", "sqlite"), named("postgresql/queries.sql", "postgresql")
    inserted, repushed = written(sqlite["unit_upsert"], "units")
    assert inserted == [*UNIT_COLUMNS, "pushed_ms"] and repushed == list(REPUSHED_COLUMNS)
    inserted, _ = written(pg["unit_insert"], "units")
    assert inserted == ["tenant", "day", *UNIT_COLUMNS, "pushed_ms"]
    pg_schema = sql_file("postgresql/schema.sql")
    for name, table in (("unit_update_mutable", "units"), ("pending_update_mutable", "pending"),
                        ("unit_terms_update_mutable", "unit_terms")):
        _, sets = written(pg[name], table)
        # (each once, in any order)
        assert sorted(sets) == sorted(c for c in REPUSHED_COLUMNS if c in table_columns(pg_schema, table)), name


def test_a_stored_unit_round_trips_through_a_day_file():
    """SQLite's statements as they run: a unit written by unit_upsert is read back whole by unit_get; a re-push
    changes its mutable fields (and the keys its metadata gives) and nothing else; the read index's sync
    keeps a row sent (2) only while every mutable field is what it sent."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.executescript(sql_file("sqlite/shard_schema.sql"))
    sql = named("sqlite/*queries.sql", "sqlite")
    parent = validate_unit(make_unit("the parent"), Config())
    first = validate_unit(make_unit("a unit", metadata={"project": "p1", "session": 4}, parent_cid=parent.cid),
                          Config())
    conn.execute(sql["unit_upsert"], {**first.columns(seq=7, thread="0123456789ab", tpos=2), "pushed_ms": 1})
    row = conn.execute(sql["unit_get"], {"cid": first.cid, "now": 0}).fetchone()
    assert unit_dict(row) == {
        "cid": first.cid, "type": "tool_output", "source": "test_v1_ci", "timestamp": first.timestamp,
        "ttl": first.ttl, "content": "a unit", "metadata": {"project": "p1", "session": 4},
        "parent_cid": parent.cid, "expires_at": first.expires_at, "seq": 7, "thread": "0123456789ab"}
    assert list(unit_dict(row)) == list(STORED_COLUMNS)
    assert {k: row[k] for k in KEPT_COLUMNS} == {"tpos": 2, "project": "p1", "is_global": 0}

    again = validate_unit({**make_unit("a unit", type="user_input", ttl=99_999, metadata={"global": True}),
                           "timestamp": first.timestamp}, Config())
    before = dict(row)
    conn.execute("UPDATE units SET indexed = 2")
    conn.execute(sql["unit_upsert"], {**again.columns(seq=8, thread="ffffffffffff", tpos=5), "pushed_ms": 2})
    after = dict(conn.execute(sql["unit_get"], {"cid": first.cid, "now": 0}).fetchone())
    changed = {k for k in after if after[k] != before[k]}
    assert changed == set(REPUSHED_COLUMNS) | {"indexed"} and after["indexed"] == 3

    sent = {name: after[name] for name in MUTABLE_FIELDS}
    conn.execute(sql["sync_mark"], {"id": after["id"], **sent})
    assert conn.execute("SELECT indexed FROM units").fetchone()[0] == 2
    for name in MUTABLE_FIELDS:            # a push changed this field after the pass read the row: send it again
        conn.execute("UPDATE units SET indexed = 3")
        conn.execute(sql["sync_mark"], {"id": after["id"], **sent, name: "changed"})
        assert conn.execute("SELECT indexed FROM units").fetchone()[0] == 3, name


def test_a_read_index_document_answers_every_field_of_a_result():
    row = {"cid": "0123456789ab", "type": "tool_output", "source": "s", "timestamp": 5, "ttl": 6, "content": "x y",
           "metadata": '{"k": [1, "ü"]}', "parent_cid": None, "expires_at": 11, "seq": 3, "thread": None,
           "tpos": 0, "ntok": 2, "tokens": "x y", "project": None, "is_global": 0}
    hit = index_schema.unit_of(index_schema.document("2024-01-01", 1, row))
    assert hit == {k: v for k, v in unit_dict(row).items() if k != "seq"}
    assert list(hit) == list(RESULT_COLUMNS)
    assert index_schema.UNIT_FIELDS == tuple(n for n in RESULT_COLUMNS if n != "content")


def test_an_index_made_with_another_list_of_fields_is_built_again():
    info = index_schema.format_info()
    assert index_schema.same_format(info)
    assert not index_schema.same_format({**info, "unit": [*info["unit"], "title"]})     # a field added since
    assert not index_schema.same_format({**info, "format": info["format"] - 1})
    # format 10's indexes, made before format.json named the list, hold FORMAT_10_UNIT
    assert index_schema.same_format({"format": info["format"]}) == (index_schema.UNIT_FIELDS ==
                                                                      index_schema.FORMAT_10_UNIT)


def test_postgresqls_read_index_array_is_the_documents():
    """node_units builds the document's unit array in SQL: the same fields, in the same order."""
    built = expand("@index_unit(u)", "postgresql")
    assert built == "json_build_array(" + ", ".join(
        "coalesce(u.thread, u.cid)" if n == "thread" else f"u.{n}" for n in index_schema.UNIT_FIELDS) + ")"


def mcp_read(client, uri: str) -> dict:
    rv = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": uri}},
                     headers={"MCP-Protocol-Version": "2025-11-25", "Accept": "application/json, text/event-stream"})
    assert rv.status_code == 200, rv.get_data(as_text=True)
    return rv.get_json()["result"]["contents"][0]


def test_every_read_answers_every_field_on_both_stores(app, client):
    """GET, list, export, lineage, default and strong search, MCP's resource and Dify's record, before and after
    a re-push changes every mutable field: each answers the unit's fields (units.py's lists), none missing."""
    rv = client.post("/mcp/push", json=make_unit("heron parent note", source="fields_v1"))
    assert rv.status_code == 200
    child = make_unit("heron fields note", source="fields_v1", metadata={"k": 1}, parent_cid=rv.get_json()["cid"])
    cid = client.post("/mcp/push", json=child).get_json()["cid"]

    def check(expected: dict):
        got = client.get(f"/mcp/units/{cid}").get_json()
        assert list(got) == list(STORED_COLUMNS) and {k: got[k] for k in expected} == expected
        listed = next(u for u in client.get("/mcp/units?source=fields_v1").get_json()["units"] if u["cid"] == cid)
        assert list(listed) == list(STORED_COLUMNS) and listed == got
        lineage = client.get(f"/mcp/units/{cid}/lineage").get_json()
        assert lineage["unit"] == got
        for body in ({"consistency": "strong"}, {}):
            [hit] = [r for r in client.post("/mcp/search", json={"query": "fields", **body}).get_json()["results"]
                     if r["cid"] == cid]
            assert list(hit)[:len(RESULT_COLUMNS)] == list(RESULT_COLUMNS), body
            assert {k: hit[k] for k in RESULT_COLUMNS} == {k: got[k] for k in RESULT_COLUMNS}, body
        meta = mcp_read(client, f"context://units/{cid}")["_meta"]["dev.context-mode/unit"]
        assert meta == {**{k: got[k] for k in DESCRIBING_FIELDS}, "seq": got["seq"], "metadata": got["metadata"]}
        [record] = client.post("/retrieval", json={"knowledge_id": "", "query": "fields"}).get_json()["records"]
        assert {k: record["metadata"][k] for k in CONDITION_FIELDS} == {k: got[k] for k in DESCRIBING_FIELDS}
        return got

    drain(app)
    replayed(app)
    first = check({"type": "tool_output", "metadata": {"k": 1}})
    again = {**child, "type": "user_input", "ttl": child["ttl"] + 60, "metadata": {"k": 2}, "parent_cid": None}
    assert client.post("/mcp/push", json=again).get_json()["status"] == "duplicate"
    drain(app)
    replayed(app)
    later = check({"type": "user_input", "ttl": again["ttl"], "metadata": {"k": 2}, "parent_cid": None,
                   "expires_at": again["timestamp"] + again["ttl"]})
    assert {k for k in STORED_COLUMNS if later[k] != first[k]} == set(MUTABLE_FIELDS)


def test_the_lists_derive_from_the_stored_fields():
    """What the shape checks above rely on: the other lists are views of STORED_FIELDS."""
    assert UNIT_COLUMNS == (*STORED_COLUMNS, *KEPT_COLUMNS)
    assert set(MUTABLE_FIELDS) < set(STORED_COLUMNS) and set(REPUSHED_COLUMNS) - set(MUTABLE_FIELDS) < set(KEPT_COLUMNS)
    assert CONDITION_FIELDS == DESCRIBING_FIELDS == tuple(n for n in STORED_COLUMNS
                                                          if n not in ("content", "metadata", "seq"))
    assert RESULT_COLUMNS == tuple(n for n in STORED_COLUMNS if n != "seq")
