"""A database's schema as sorted text lines, read from pg_catalog: what two databases must
share when one was built from the migrations and the other upgraded through them.

Names that depend on the day or on the order objects were made in are normalised: day
partitions are `job_runs_pYYYYMMDD` and `run_history_pYYYYMMDD` (their indexes and
constraints named by the parent index or constraint they belong to), and a day
partition's bounds are checked to be one UTC day rather than printed. Every day
partition must have the same lines; a line `... variants` counts the distinct sets, so a
day that differs from the others shows up too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timedelta

DAY = re.compile(r"(job_runs|run_history)_p\d{8}")
DAY_NAME = r"\1_pYYYYMMDD"
_BOUNDS = re.compile(r"^FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)$")
_KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}
# Relations an extension created (Citus's views in public) belong to it, not to the migrations.
_NOT_AN_EXTENSIONS_OWN = """
        AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = 'pg_class'::regclass
                        AND e.objid = c.oid AND e.deptype = 'e')
"""
_INDEX_NAME = re.compile(r"^(CREATE (?:UNIQUE )?INDEX )(\S+)( ON )")


def schema(cursor) -> dict[str, list[str]]:
    """{"schema": lines any PostgreSQL shows alike, "engine": extensions, the database's
    own settings and, on Citus, how each table is distributed}."""
    relations = _relations(cursor)
    per_table: dict[str, set[str]] = defaultdict(set)
    for name, line in relations.values():
        per_table[name].add(line)
    for table, line in (
        _columns(cursor, relations) + _indexes(cursor, relations) + _constraints(cursor, relations)
    ):
        per_table[table].add(line)
    for table, line in _sequences(cursor):
        per_table[table].add(line)
    lines: set[str] = set()
    day_variants: dict[str, set[frozenset[str]]] = {"job_runs": set()}
    for table, table_lines in per_table.items():
        if day := DAY.fullmatch(table):
            normalised = frozenset(DAY.sub(DAY_NAME, line) for line in table_lines)
            day_variants.setdefault(day.group(1), set()).add(normalised)
            lines |= normalised
        else:
            lines |= {DAY.sub(DAY_NAME, line) for line in table_lines}
    for parent, variants in day_variants.items():
        lines.add(f"{parent}_pYYYYMMDD: {len(variants)} variants")
    return {"schema": sorted(lines), "engine": sorted(_engine(cursor))}


def _relations(cursor) -> dict[int, tuple[str, str]]:
    cursor.execute(
        """
        SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.reloptions::text,
               pg_get_partkeydef(c.oid), pg_get_expr(c.relpartbound, c.oid),
               (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                WHERE i.inhrelid = c.oid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
        """
        + _NOT_AN_EXTENSIONS_OWN
    )
    out = {}
    for oid, name, kind, persistence, options, partkey, bound, parent in cursor.fetchall():
        line = f"{name}: {_KINDS[kind]}" + (" UNLOGGED" if persistence == "u" else "")
        line += f" WITH {options}" if options else ""
        if partkey:
            line += f" PARTITION BY {partkey}"
        if parent:
            line += f" partition of {parent} {_bound(name, bound)}"
        out[oid] = (name, line)
    return out


def _bound(name: str, bound: str) -> str:
    """A day partition's range, as whether it is the UTC day its name says."""
    match = _BOUNDS.match(bound or "")
    if not DAY.fullmatch(name) or not match:
        return bound
    lower, upper = (datetime.fromisoformat(value) for value in match.groups())
    named_day = datetime.strptime(name[-8:], "%Y%m%d").date()
    ok = lower.utcoffset() == timedelta(0) and lower.date() == named_day and lower.time().hour == 0
    return "FOR VALUES the UTC day of its name" if ok and upper - lower == timedelta(days=1) else bound


def _columns(cursor, relations: dict) -> list[tuple[str, str]]:
    cursor.execute(
        """
        SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               coll.collname,
               row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum)
        FROM pg_attribute a
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation coll ON coll.oid = a.attcollation AND coll.collname <> 'default'
        WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attrelid = ANY(%s)
        """,
        [list(relations)],
    )
    out = []
    for rel, name, type_, notnull, default, identity, generated, collation, position in cursor.fetchall():
        line = f"{relations[rel][0]}: column {position:02d} {name} {type_}" + (" NOT NULL" if notnull else "")
        line += f" DEFAULT {default}" if default is not None else ""
        line += f" identity={identity}" if identity else ""
        line += f" generated={generated}" if generated else ""
        line += f" COLLATE {collation}" if collation else ""
        out.append((relations[rel][0], line))
    return out


def _indexes(cursor, relations: dict) -> list[tuple[str, str]]:
    """An index of a partition is named by the partitioned index it belongs to: its own
    name is generated and depends on the order indexes were made in."""
    cursor.execute(
        """
        SELECT x.indrelid, i.relname, pg_get_indexdef(x.indexrelid), x.indisvalid, x.indisready,
               (SELECT p.relname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
                WHERE h.inhrelid = x.indexrelid)
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = ANY(%s)
        """,
        [list(relations)],
    )
    out = []
    for rel, name, definition, valid, ready, parent in cursor.fetchall():
        table = relations[rel][0]
        shown = parent or name
        if parent or DAY.fullmatch(table):
            definition = _INDEX_NAME.sub(rf"\g<1>({shown})\g<3>", definition)
        state = "" if valid and ready else f" valid={valid} ready={ready}"
        out.append((table, f"{table}: index {shown}: {definition}{state}"))
    return out


def _constraints(cursor, relations: dict) -> list[tuple[str, str]]:
    cursor.execute(
        """
        SELECT c.conrelid, c.conname, pg_get_constraintdef(c.oid), c.convalidated,
               (SELECT p.conname FROM pg_constraint p WHERE p.oid = c.conparentid)
        FROM pg_constraint c WHERE c.conrelid = ANY(%s)
        """,
        [list(relations)],
    )
    out = []
    for rel, name, definition, validated, parent in cursor.fetchall():
        table = relations[rel][0]
        shown = f"({parent})" if parent else name
        out.append((table, f"{table}: constraint {shown} {definition}" + ("" if validated else " NOT VALID")))
    return out


def _sequences(cursor) -> list[tuple[str, str]]:
    cursor.execute(
        """
        SELECT c.relname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement, s.seqmax,
               s.seqmin, s.seqcache, s.seqcycle,
               (SELECT t.relname || '.' || a.attname || ' (' || d.deptype::text || ')'
                FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid
                JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_sequence s ON s.seqrelid = c.oid
        WHERE n.nspname = 'public'
        """
        + _NOT_AN_EXTENSIONS_OWN
    )
    return [
        (name, f"{name}: sequence {type_} start={start} increment={inc} max={max_} min={min_}"
               f" cache={cache} cycle={cycle} owned by {owner}")
        for name, type_, start, inc, max_, min_, cache, cycle, owner in cursor.fetchall()
    ]  # fmt: skip


def _engine(cursor) -> list[str]:
    cursor.execute("SELECT extname FROM pg_extension")
    lines = [f"extension {name}" for (name,) in cursor.fetchall()]
    cursor.execute(
        """
        SELECT unnest(s.setconfig) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
        WHERE d.datname = current_database() AND s.setrole = 0
        """
    )
    lines += [f"database setting {setting}" for (setting,) in cursor.fetchall()]
    if "extension citus" in lines:
        # Tables of one co-location group are named by the first of them, not its number.
        cursor.execute(
            """
            SELECT logicalrelid::text, partmethod, repmodel,
                   CASE WHEN partkey IS NULL THEN NULL
                        ELSE column_to_column_name(logicalrelid, partkey) END,
                   min(logicalrelid::text) OVER (PARTITION BY colocationid)
            FROM pg_dist_partition
            """
        )
        lines += [
            f"citus {DAY.sub(DAY_NAME, table)}: method={method} replication={rep} column={column}"
            f" colocated with {DAY.sub(DAY_NAME, group)}"
            for table, method, rep, column, group in cursor.fetchall()
        ]
    return lines
