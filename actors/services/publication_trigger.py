"""The event trigger that puts publication definitions into the WAL, and the SQL around it.

pgoutput decodes every change with the catalog as of that change's position in the WAL. For
routes that follow a publication to do the same, the definitions must travel with the
changes: an event trigger on ``ddl_command_start``/``ddl_command_end`` compares a snapshot of
the definitions before and after each CREATE/ALTER/DROP PUBLICATION, CREATE/ALTER/DROP TABLE,
DROP INDEX, ALTER/DROP SCHEMA and, when it changed, emits one *transactional* logical decoding
message (prefix ``router.routing.definitions.PREFIX``) with both snapshots, right after the command,
inside its transaction: it is decoded in order with the changes, exactly where pgoutput's own
cache is invalidated. A DDL statement that changes nothing routes care about (a temporary
table, a column on an unpublished table) emits nothing.

The snapshot (``pgrouter.publication_snapshot()``): every publication of the database (actions,
FOR ALL TABLES, TABLES IN SCHEMA, ``publish_via_partition_root``, listed tables with the row
filter as ``pg_get_expr`` prints it and the column list) and every table in a partition tree
(kind, ancestors parent first, columns with their replica-identity flag, replica identity).
Plain tables are described by the Relation messages of the stream itself.

Each change is also logged (its LSN only) in the *unlogged* table ``pgrouter.definitions_log``
(never decoded, never published, emptied by a crash), so a router starting without a state
record can tell cheaply whether its slot's backlog holds a change (``changes_since``) and
decode the backlog once to find it only then.

TRUNCATE of partition trees: pgoutput sends a partitioned table's TRUNCATE for a publication
that publishes it via its root only when that table itself was truncated (not one of its
partitions), and a slot whose publications send partitions names only the leaves. So every
partitioned table carries the statement trigger ``pgrouter_truncate`` (BEFORE TRUNCATE, FOR
EACH STATEMENT), which emits a transactional message (prefix ``router.routing.definitions.
TRUNCATE_PREFIX``, content ``["schema", "name"]``) just before the truncate is logged; the
event trigger puts it on partitioned tables created later. PostgreSQL fires it for each
partitioned table the statement truncates (the named one and partitioned partitions below
it), never for a TRUNCATE of a partition alone.

Installing (``pgrouter setup``) needs a superuser on PostgreSQL 15 (event triggers). The
trigger function is SECURITY DEFINER (owned by that superuser), so the owner of a publication
needs no right to ``pg_logical_emit_message`` to run its DDL.
"""

from __future__ import annotations

from router.routing.definitions import PREFIX, TRUNCATE_PREFIX
from router.postgres.identifiers import publication_names

from .sql import SqlSession

SCHEMA = "pgrouter"
TRIGGERS = ("pgrouter_definitions_before", "pgrouter_definitions_after")
#: the statement trigger on every partitioned table (TRUNCATE of partition trees)
TRUNCATE_TRIGGER = "pgrouter_truncate"
TAGS = ("CREATE PUBLICATION", "ALTER PUBLICATION", "DROP PUBLICATION", "CREATE TABLE",
        "ALTER TABLE", "DROP TABLE", "DROP INDEX", "ALTER SCHEMA", "DROP SCHEMA")

_SNAPSHOT = r"""
create or replace function pgrouter.publication_snapshot() returns jsonb
language sql stable as $fn$
select jsonb_build_object(
  'publications', coalesce((
    select jsonb_object_agg(p.pubname, jsonb_build_object(
      'all_tables', p.puballtables, 'insert', p.pubinsert, 'update', p.pubupdate,
      'delete', p.pubdelete, 'truncate', p.pubtruncate, 'via_root', p.pubviaroot,
      -- publish_generated_columns = stored (PostgreSQL 18; absent before, hence to_jsonb)
      'generated_columns', coalesce((to_jsonb(p) ->> 'pubgencols') = 's', false),
      'schemas', coalesce((select jsonb_agg(n.nspname::text order by n.nspname)
                           from pg_publication_namespace pn
                           join pg_namespace n on n.oid = pn.pnnspid
                           where pn.pnpubid = p.oid), '[]'),
      'tables', coalesce((select jsonb_agg(jsonb_build_array(
                             n.nspname::text, c.relname::text,
                             pg_get_expr(pr.prqual, pr.prrelid),
                             case when pr.prattrs is null then null else
                               (select jsonb_agg(a.attname::text order by a.attnum)
                                from pg_attribute a where a.attrelid = pr.prrelid
                                and a.attnum = any(pr.prattrs::int2[])) end)
                             order by n.nspname, c.relname)
                          from pg_publication_rel pr
                          join pg_class c on c.oid = pr.prrelid
                          join pg_namespace n on n.oid = c.relnamespace
                          where pr.prpubid = p.oid), '[]')))
    from pg_publication p), '{}'),
  'tables', coalesce((
    select jsonb_agg(jsonb_build_object(
      'schema', n.nspname::text, 'name', c.relname::text, 'relkind', c.relkind::text,
      'replica_identity', c.relreplident::text,
      'ancestors', coalesce((
          select jsonb_agg(jsonb_build_array(an.nspname::text, ac.relname::text)
                           order by anc.ord)
          from pg_partition_ancestors(c.oid) with ordinality as anc(relid, ord)
          join pg_class ac on ac.oid = anc.relid
          join pg_namespace an on an.oid = ac.relnamespace
          where anc.relid <> c.oid), '[]'),
      'columns', coalesce((
          select jsonb_agg(jsonb_build_array(
                   a.attname::text, a.atttypid::int8, a.atttypmod,
                   c.relreplident = 'f' or a.attnum = any(coalesce((
                     select i.indkey::int2[] from pg_index i
                     where i.indrelid = c.oid and i.indisvalid
                       and ((c.relreplident = 'd' and i.indisprimary)
                         or (c.relreplident = 'i' and i.indisreplident))
                     limit 1), '{}')),
                   a.attgenerated = 's')
                 order by a.attnum)
          from pg_attribute a
          where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
            and (a.attgenerated = '' or (a.attgenerated = 's' and gen.publishable))), '[]'))
      order by n.nspname, c.relname)
    from pg_class c join pg_namespace n on n.oid = c.relnamespace,
         -- stored generated columns can be published from PostgreSQL 18 on
         (select current_setting('server_version_num')::int >= 180000 as publishable) gen
    where (c.relkind = 'p' or (c.relkind = 'r' and c.relispartition)
           or (c.relkind = 'r' and gen.publishable and exists (
                 select from pg_attribute g where g.attrelid = c.oid and g.attnum > 0
                 and not g.attisdropped and g.attgenerated = 's')))
      and n.nspname not in ('pg_catalog', 'information_schema')), '[]'))
$fn$;
"""

_TRUNCATE_MARKER = f"""
create or replace function pgrouter.truncate_marker() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $fn$
begin
  perform pg_logical_emit_message(true, '{TRUNCATE_PREFIX}',
                                  jsonb_build_array(tg_table_schema, tg_table_name)::text);
  return null;
end
$fn$;

create or replace function pgrouter.mark_partitioned_tables() returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $fn$
declare
  rel regclass;
begin
  for rel in select c.oid::regclass from pg_class c join pg_namespace n on n.oid = c.relnamespace
             where c.relkind = 'p' and c.relpersistence = 'p'
               and n.nspname not in ('pg_catalog', 'information_schema')
               and not exists (select from pg_trigger t where t.tgrelid = c.oid
                               and t.tgname = '{TRUNCATE_TRIGGER}')
  loop
    execute format('create trigger {TRUNCATE_TRIGGER} before truncate on %s for each statement '
                   'execute function pgrouter.truncate_marker()', rel);
  end loop;
end
$fn$;
"""

_TRIGGER_FUNCTION = f"""
create or replace function pgrouter.definitions_trigger() returns event_trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $fn$
declare
  now_ jsonb;
  before_ text;
begin
  if tg_event = 'ddl_command_start' then
    perform set_config('pgrouter.definitions_before',
                       pgrouter.publication_snapshot()::text, true);
    return;
  end if;
  perform pgrouter.mark_partitioned_tables();
  before_ := current_setting('pgrouter.definitions_before', true);
  now_ := pgrouter.publication_snapshot();
  if before_ is not null and before_ <> '' and before_::jsonb = now_ then
    return;
  end if;
  insert into pgrouter.definitions_log (kind, lsn) values ('change', pg_current_wal_insert_lsn());
  delete from pgrouter.definitions_log l where l.kind = 'change' and l.lsn < (
    select min(restart_lsn) from pg_replication_slots where plugin = 'pgoutput');
  perform pg_logical_emit_message(true, '{PREFIX}', jsonb_build_object(
    'v', 1, 'event', 'change', 'tag', tg_tag,
    'before', case when before_ is null or before_ = '' then null else before_::jsonb end,
    'after', now_)::text);
  perform set_config('pgrouter.definitions_before', now_::text, true);
end
$fn$;
"""


def install_sql() -> list[str]:
    """The statements ``pgrouter setup`` runs (idempotent)."""
    tags = ", ".join(f"'{t}'" for t in TAGS)
    out = [f"create schema if not exists {SCHEMA}",
           f"create unlogged table if not exists {SCHEMA}.definitions_log "
           "(kind text not null, lsn pg_lsn not null)",
           f"insert into {SCHEMA}.definitions_log select 'installed', pg_current_wal_insert_lsn()"
           f" where not exists (select from {SCHEMA}.definitions_log where kind = 'installed')",
           _SNAPSHOT, _TRUNCATE_MARKER, _TRIGGER_FUNCTION,
           f"select {SCHEMA}.mark_partitioned_tables()"]
    for name, event in zip(TRIGGERS, ("ddl_command_start", "ddl_command_end")):
        out.append(f"drop event trigger if exists {name}")
        out.append(f"create event trigger {name} on {event} when tag in ({tags}) "
                   "execute function pgrouter.definitions_trigger()")
    return out


def uninstall_sql() -> list[str]:
    return [*(f"drop event trigger if exists {t}" for t in TRIGGERS),
            f"drop schema if exists {SCHEMA} cascade"]


async def installed(sql: SqlSession) -> bool:
    """Both event triggers exist and are enabled (``evtenabled`` not 'D'), and so does the
    TRUNCATE marker (an installation by an older pgrouter lacks it: ``setup`` again)."""
    n = await sql.fetchval("select count(*) from pg_event_trigger where evtname = any($1::text[])"
                           " and evtenabled <> 'D'", list(TRIGGERS))
    marker = await sql.fetchval("select exists (select from pg_proc p join pg_namespace n on "
                                "n.oid = p.pronamespace where n.nspname = $1 and "
                                "p.proname = 'truncate_marker')", SCHEMA)
    return n == len(TRIGGERS) and bool(marker)


async def install(sql: SqlSession) -> None:
    """All statements in one implicit transaction (the simple query protocol)."""
    await sql.execute(";\n".join(install_sql()))


async def superuser(sql: SqlSession) -> bool:
    return bool(await sql.fetchval("select rolsuper from pg_roles where rolname = current_user"))


async def snapshot_text(sql: SqlSession) -> str:
    """The definitions now, as the trigger would describe them."""
    return await sql.fetchval(f"select {SCHEMA}.publication_snapshot()::text")


async def emit_baseline(sql: SqlSession) -> str:
    """A message with the definitions now (no ``before``): a router whose slot was created
    just before starts from it. Returns its LSN."""
    return await sql.fetchval(
        "select pg_logical_emit_message(true, $1, jsonb_build_object('v', 1, 'event', "
        "'baseline', 'tag', 'pgrouter setup', 'before', null, 'after', "
        f"{SCHEMA}.publication_snapshot())::text)::text", PREFIX)


async def changes_since(sql: SqlSession, slot: str) -> bool:
    """Whether a definitions change may lie in the slot's backlog: one was logged at or after
    the slot's ``restart_lsn`` (every transaction the slot still has to send began there or
    later), or the log cannot tell (installed after that point, or emptied by a crash:
    ``definitions_log`` is unlogged, so it is neither decoded nor published)."""
    row = await sql.fetch(
        f"select (select lsn from {SCHEMA}.definitions_log where kind = 'installed') "
        "<= s.restart_lsn as complete, exists (select from "
        f"{SCHEMA}.definitions_log l where l.kind = 'change' and l.lsn >= s.restart_lsn) "
        "as changed from pg_replication_slots s where s.slot_name = $1", slot)
    return not row or not row[0]["complete"] or row[0]["changed"]


async def first_message(sql: SqlSession, slot: str, publications: list[str],
                        upto_lsn: str) -> bytes | None:
    """The content of the first definitions message the slot would send from its confirmed
    position up to ``upto_lsn``, without consuming anything (the slot must not be active).
    The server decodes the backlog once; only the messages of our prefix come back."""
    rows = await sql.fetch(
        "select data from pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, null, "
        "'proto_version', '1', 'publication_names', $3, 'messages', 'true') "
        "where get_byte(data, 0) = 77 and position($4::bytea in data) > 0 limit 1",
        slot, upto_lsn, publication_names(publications), PREFIX.encode() + b"\x00")
    return bytes(rows[0]["data"]) if rows else None
