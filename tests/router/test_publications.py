"""Combining publications for one table, as pgoutput's get_rel_sync_entry does."""

from __future__ import annotations

import pytest

from router.pgoutput import Relation, RelationColumn
from router.routing.publications import (Catalog, CatalogColumn, ColumnListConflict, FilterCache,
                                 Planner, PubTable, Publication, TableInfo,
                                 publication_resolver, resolve)

INT4, TEXT = 23, 25


def cols(*names, keys=("a",)):
    return tuple(CatalogColumn(n, INT4, -1, n in keys) for n in names)


T1 = TableInfo("public", "t1", columns=cols("a", "b", "c"))
PARENT = TableInfo("public", "parent", relkind="p", columns=cols("a", "b"),
                   leaves=frozenset({("public", "child")}))
CHILD = TableInfo("public", "child", ancestors=(("public", "parent"),),
                  columns=cols("b", "a"))
TABLES = {t.qualified: t for t in (T1, PARENT, CHILD)}


def pub(name, tables=None, **kw):
    return Publication(name=name, tables=tables or {}, **kw)


def test_filters_or_across_publications_per_action():
    p1 = pub("p1", {("public", "t1"): PubTable(where="(a > 5)")})
    p2 = pub("p2", {("public", "t1"): PubTable(where="(b = 1)")}, update=False, delete=False)
    r = resolve(T1, [p1, p2], TABLES)
    assert r.insert_filters == ("(a > 5)", "(b = 1)")
    assert r.update_filters == ("(a > 5)",) and r.delete_filters == ("(a > 5)",)


@pytest.mark.parametrize("other", [
    pub("nofilter", {("public", "t1"): PubTable()}, update=False, delete=False),
    pub("all", all_tables=True, update=False, delete=False),
    pub("schema", schemas=frozenset({"public"}), update=False, delete=False),
])
def test_unfiltered_publication_removes_filtering_for_its_actions(other):
    p1 = pub("p1", {("public", "t1"): PubTable(where="(a > 5)")})
    r = resolve(T1, [p1, other], TABLES)
    assert r.insert_filters is None
    assert r.update_filters == ("(a > 5)",) and r.delete_filters == ("(a > 5)",)


def test_actions_are_ored_and_unpublished_table_is_none():
    p = pub("p", {("public", "t1"): PubTable()}, insert=False, truncate=False)
    q = pub("q", {("public", "t1"): PubTable()}, update=False, delete=False, truncate=False)
    r = resolve(T1, [p, q], TABLES)
    assert (r.insert, r.update, r.delete, r.truncate) == (True, True, True, False)
    assert resolve(T1, [pub("x")], TABLES) is None


def test_column_lists_must_agree_and_full_list_is_no_list():
    a = pub("a", {("public", "t1"): PubTable(columns=("a", "b"))})
    b = pub("b", {("public", "t1"): PubTable(columns=("b", "a"))})
    assert resolve(T1, [a, b], TABLES).columns == frozenset({"a", "b"})
    with pytest.raises(ColumnListConflict):
        resolve(T1, [a, pub("c", {("public", "t1"): PubTable()})], TABLES)
    full = pub("f", {("public", "t1"): PubTable(columns=("c", "b", "a"))})
    assert resolve(T1, [full, pub("n", {("public", "t1"): PubTable()})], TABLES).columns is None


def test_partition_via_root_uses_root_filter_and_leaf_otherwise():
    both = {("public", "parent"): PubTable(where="(a < 5)"),
            ("public", "child"): PubTable(where="(a >= 5)")}
    r = resolve(CHILD, [pub("p4", both, via_root=True)], TABLES)
    assert r.publish_as == ("public", "parent") and r.insert_filters == ("(a < 5)",)
    r = resolve(CHILD, [pub("p4", both)], TABLES)
    assert r.publish_as == ("public", "child") and r.insert_filters == ("(a >= 5)",)
    # only the root listed, not via root: the partition is published unfiltered (as PG 15)
    r = resolve(CHILD, [pub("p", {("public", "parent"): PubTable(where="(a < 5)")})], TABLES)
    assert r.publish_as == ("public", "child") and r.insert_filters is None
    # a partitioned table itself is published only via root
    assert resolve(PARENT, [pub("p", {("public", "parent"): PubTable()})], TABLES) is None
    r = resolve(CHILD, [pub("all", all_tables=True, via_root=True)], TABLES)
    assert r.publish_as == ("public", "parent")


def test_planner_maps_partition_rows_to_root_by_name_and_compiles_once():
    relation = Relation(9, "public", "child", "d",
                        (RelationColumn(0, "b", INT4, -1), RelationColumn(1, "a", INT4, -1)))
    p4 = pub("p4", {("public", "parent"): PubTable(where="(a < 5)", columns=("a",))},
             via_root=True, truncate=False)
    catalog = Catalog(publications={"p4": p4}, tables=TABLES)
    planner = Planner("r", publication_resolver([p4], catalog),
                      frozenset({"insert", "update", "delete", "truncate"}), TABLES,
                      FilterCache())
    plan = planner(relation)
    assert plan is planner(relation)  # cached per layout
    assert plan["publish_as"].name == "parent" and plan["row_map"] == (1, 0)
    assert plan["columns"] == (0,) and plan["publish_truncate"] is False
    row = ("100", "3")  # child order: b, a
    mapped = tuple(row[i] for i in plan["row_map"])
    assert plan["insert_filter"](mapped) is True
    assert plan["insert_filter"](("7", "100")) is False
    assert plan["insert_filter"]((None, "1")) is False  # NULL is false


# PostgreSQL 18: stored generated columns (logicalrep_should_publish_column)
GEN = TableInfo("public", "g", columns=(CatalogColumn("a", INT4, -1, True),
                                        CatalogColumn("b", INT4),
                                        CatalogColumn("twice", INT4, generated=True)))
GEN_TABLES = {GEN.qualified: GEN}


def test_generated_columns_only_with_publish_generated_columns_or_a_column_list():
    entry = {("public", "g"): PubTable()}
    plain = resolve(GEN, [pub("plain", entry)], GEN_TABLES)
    assert plain.columns == frozenset({"a", "b"})  # "all columns" leaves generated ones out
    stored = resolve(GEN, [pub("stored", entry, generated_columns=True)], GEN_TABLES)
    assert stored.columns is None  # every column, the generated one included
    listed = resolve(GEN, [pub("l", {("public", "g"): PubTable(columns=("a", "twice"))})],
                     GEN_TABLES)
    assert listed.columns == frozenset({"a", "twice"})  # a list publishes what it names
    everything = resolve(GEN, [pub("all", all_tables=True)], GEN_TABLES)
    assert everything.columns == frozenset({"a", "b"})


def test_publications_disagreeing_on_generated_columns_cannot_be_combined():
    entry = {("public", "g"): PubTable()}
    with pytest.raises(ColumnListConflict):
        resolve(GEN, [pub("plain", entry), pub("stored", entry, generated_columns=True)],
                GEN_TABLES)


def test_tables_without_generated_columns_are_unchanged():
    assert resolve(T1, [pub("p", {("public", "t1"): PubTable()})], TABLES).columns is None
