"""The upgrade path: an installation of every earlier version, brought up
to date with ALTER EXTENSION UPDATE, has exactly the objects of a fresh
install of the newest version (redis_lock--1.4.sql), down to function
bodies, defaults, privileges, comments and the table's constraints."""
import pytest

import testbed

# every object of the extension, described by what a user could notice
DESCRIBE = """
SELECT 'function' AS kind, p.proname || '(' || pg_get_function_arguments(p.oid) || ')' AS name,
       concat_ws(' | ', pg_get_function_result(p.oid), l.lanname, p.provolatile,
                 p.proparallel, p.prosecdef, p.proconfig::text, p.prosrc, p.probin,
                 p.proacl::text, obj_description(p.oid, 'pg_proc')) AS detail
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
UNION ALL
SELECT CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END, c.relname,
       concat_ws(' | ', pg_get_viewdef(c.oid), c.relacl::text,
                 obj_description(c.oid, 'pg_class'))
FROM pg_class c
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
UNION ALL
SELECT 'column', c.relname || '.' || a.attname,
       concat_ws(' | ', a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                 pg_get_expr(ad.adbin, ad.adrelid))
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
WHERE a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', conname, pg_get_constraintdef(co.oid)
FROM pg_constraint co JOIN pg_class c ON c.oid = co.conrelid
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
UNION ALL
SELECT 'index', i.relname, pg_get_indexdef(i.oid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
UNION ALL
SELECT 'event trigger', evtname, concat_ws(' | ', evtevent, evttags::text, evtfoid::regproc, evtenabled)
FROM pg_event_trigger t
JOIN pg_depend d ON d.classid = 'pg_event_trigger'::regclass AND d.objid = t.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
UNION ALL
SELECT 'extension', extname, concat_ws(' | ', extversion, extrelocatable,
       (SELECT string_agg(c::regclass::text, ',') FROM unnest(extconfig) c), extcondition::text)
FROM pg_extension WHERE extname = 'redis_lock'
UNION ALL
SELECT 'member', pg_describe_object(classid, objid, objsubid), ''
FROM pg_depend WHERE deptype = 'e'
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'redis_lock')
ORDER BY 1, 2
"""


def describe(pg, db):
    conn = pg.connect(dbname=db)
    try:
        with conn.cursor() as cur:
            cur.execute(DESCRIBE)
            return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def fresh(pg):
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS fresh14")
        cur.execute("CREATE DATABASE fresh14")
    admin.close()
    conn = pg.connect(dbname="fresh14")
    with conn.cursor() as cur:
        cur.execute("CREATE EXTENSION redis_lock")
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'redis_lock'")
        assert cur.fetchone()[0] == "1.4"
    conn.close()
    return describe(pg, "fresh14")


@pytest.mark.parametrize("start", ["1.0", "1.1", "1.2", "1.3"])
def test_an_upgraded_install_matches_a_fresh_one(pg, fresh, start):
    db = "from" + start.replace(".", "")
    admin = pg.connect()
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS " + db)
        cur.execute("CREATE DATABASE " + db)
    admin.close()
    conn = pg.connect(dbname=db)
    with conn.cursor() as cur:
        cur.execute("CREATE EXTENSION redis_lock VERSION %s", (start,))
        cur.execute("ALTER EXTENSION redis_lock UPDATE")
    conn.close()
    upgraded = describe(pg, db)
    assert len(fresh) > 40
    missing = sorted(set(fresh) - set(upgraded))
    extra = sorted(set(upgraded) - set(fresh))
    assert not missing and not extra, "fresh only: %s\nupgraded only: %s" % (missing, extra)
    # and the upgraded one works: every function is callable
    conn = pg.connect(dbname=db)
    try:
        assert testbed.sql_one(conn, "SELECT redis_lock_try_acquire_read('up')") is True
        assert testbed.sql_one(conn, "SELECT mode FROM redis_lock_held()") == "read"
        assert testbed.sql_one(conn, "SELECT mode FROM redis_lock_locks") == "read"
        assert testbed.sql_one(conn, "SELECT redis_lock_release_read('up')") is True
        assert len(testbed.sql_one(conn, "SELECT redis_lock_acquire_many(ARRAY['u1', 'u2'])")) == 2
        assert testbed.sql_one(conn, "SELECT redis_lock_release_many(ARRAY['u1', 'u2'])") == 2
    finally:
        conn.close()
