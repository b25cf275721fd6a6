"""The documentation (README.md and doc/*.md) is tested like code.

- Every link resolves: a relative link names a file or directory of the tree,
  and a `#anchor` (alone or after a .md file) is the GitHub slug of a heading
  of that page.
- doc/reference.md lists exactly the extension's SQL functions (every
  signature, with its argument names), its `redis_lock.*` settings (with
  the range each accepts, as pg_settings gives it), its views
  and tables, as an installed extension has them (pg_proc, pg_depend,
  pg_settings), and exactly the SQLSTATEs that src/*.c and the install
  script raise.  The columns of every function returning a record or a set
  of records, and of every view and table, are the list of its row there
  (its first code span of comma-separated `name type` items), in order,
  with the types the installed extension has.
- Every ```sql block of README.md and doc/*.md runs against the test bed (a
  preloaded PostgreSQL with the extension, a Redis), each in a new psql
  session, in a database of its page, blocks of a page in order.  Markers on
  the lines right before a block say how:
      <!-- sql setup: SQL -->      run first in the same session, not shown
      <!-- sql fails: SQLSTATE --> the block must fail with this SQLSTATE
      <!-- sql not run: REASON --> not run; the reason must be given
  A block introduced by `<!-- snippet: … -->` or `<!-- file: … -->` is not
  run here: t/test_readme.py checks it is the code another suite runs.
- doc/architecture.md's table names every src/*.c and only files that exist.
- doc/performance.md's generated part is what `bench/report --doc` makes of
  bench/published/results.json."""
import glob
import os
import re
import subprocess
import textwrap

import pytest

import testbed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "doc", "*.md")))
FENCE = re.compile(r"^\s*```")
MARKER = re.compile(r"^\s*<!-- (sql setup|sql fails|sql not run|snippet|file):\s*(.*?)\s*-->$")


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def prose_lines(text):
    """(line number, line) outside code fences."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, line


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    found = set()
    for _, line in prose_lines(read(path)):
        m = re.match(r"^#{1,6} (.*)$", line)
        if m:
            base = slug(m.group(1))
            name, k = base, 0
            while name in found:
                k += 1
                name = "%s-%d" % (base, k)
            found.add(name)
    return found


def links(path):
    return links_in(read(path))


def links_in(text):
    """(line number, target) of every markdown link in text's prose."""
    prev = None
    for n, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)          # not in inline code
        line = re.sub(r"<!--.*?-->", "", line)
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", line):
            yield n, m.group(1)
        # a link text may span two lines: [text
        # more](target)
        if prev is not None:
            for m in re.finditer(r"!?\[[^\]\[]*\n[^\]\[]*\]\(([^)\s]+)\)", prev + "\n" + line):
                yield n, m.group(1)
        prev = line


def test_a_link_whose_text_spans_two_lines_is_checked():
    text = "See [the first\nsecond](nowhere.md#x) and [one](here.md).\n"
    assert sorted(t for _, t in links_in(text)) == ["here.md", "nowhere.md#x"]


def test_every_link_and_anchor_resolves():
    checked, bad = 0, []
    for page in PAGES:
        for n, target in links(page):
            checked += 1
            if re.match(r"[a-z]+:", target):
                continue                            # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) \
                if file_part else page
            if not os.path.exists(os.path.join(ROOT, dest)):
                bad.append("%s:%d: %s: no such file" % (page, n, target))
            elif anchor and anchor not in anchors(dest):
                bad.append("%s:%d: %s: no such heading in %s" % (page, n, target, dest))
    assert checked > 50
    assert bad == []


def test_readme_is_a_landing_page():
    readme = read("README.md")
    assert len(readme.split("\n")) <= 300
    # it maps every page of doc/
    for page in PAGES[1:]:
        assert "](%s)" % page in readme, page


def test_architecture_table_names_every_source_file():
    """doc/architecture.md's table: the src/ files named in the first column of
    its rows are exactly src/*.c (and the headers they name exist)."""
    named = set()
    for m in re.finditer(r"^\| ([^|]*) \|", read("doc/architecture.md"), re.M):
        named |= set(re.findall(r"`(src/[\w./]+)`", m.group(1)))
    missing = {p for p in named if not os.path.exists(os.path.join(ROOT, p))}
    assert missing == set(), "named in doc/architecture.md but not in the tree"
    sources = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "src", "*", "*.c"))}
    assert sources - named == set(), "src/*.c files without a row in doc/architecture.md"


def entry_transitions_in_code():
    """The (from, to) pairs of src/lock/lockstate.c's table of allowed
    transitions (the one rl_lt_set_state asserts)."""
    text = read("src/lock/lockstate.c")
    table = re.search(r"allowed\[NSTATES\]\[NSTATES\] = \{(.*?)\n\};", text, re.S).group(1)
    pairs = set()
    for frm, row in re.findall(r"\[RL_ENTRY_(\w+)\] = \{(.*?)\}", table, re.S):
        pairs |= {(frm, to) for to in re.findall(r"\[RL_ENTRY_(\w+)\] = true", row)}
    return pairs


def test_entry_life_diagram_and_table_are_the_codes():
    """doc/architecture.md's "The life of a lock entry": its state diagram
    and its table of transitions say exactly what lockstate.c allows, and
    name every state of RLHeldState."""
    code = entry_transitions_in_code()
    states = set(re.findall(r"^\s*RL_ENTRY_(\w+)\b", read("src/lock/lock.h"), re.M))
    assert {s for pair in code for s in pair} == states
    life = section(read("doc/architecture.md"), "The life of a lock entry")
    diagram = re.search(r"```mermaid\n(.*?)```", life, re.S).group(1)
    drawn = set(re.findall(r"^\s*(\w+) --> (\w+):", diagram, re.M))
    assert drawn == code
    tabled = set()
    for frm, to in re.findall(r"^\| ([A-Z_, ]+) \| ([A-Z_, ]+) \|", life, re.M):
        tabled |= {(f, t) for f in frm.split(", ") for t in to.split(", ")}
    assert tabled == code


# --- the reference and the catalog ---------------------------------------

def section(text, title):
    start = text.index("\n## %s\n" % title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def documented_functions():
    """{name: [argument names of each signature]} from the reference's table."""
    found = {}
    for m in re.finditer(r"^\| `(redis_(?:lock_|semaphore)\w*)\(([^)]*)\)` \|",
                         section(read("doc/reference.md"), "Functions"), re.M):
        args = [a.strip().split()[0] for a in m.group(2).split(",") if a.strip()]
        found.setdefault(m.group(1), []).append(args)
    return found


def test_reference_lists_every_function_setting_and_view(pg):
    c = pg.connect()
    try:
        with c.cursor() as cur:
            cur.execute("""
                SELECT p.proname,
                       coalesce((SELECT array_agg(n ORDER BY i)
                                 FROM unnest(p.proargnames, p.proargmodes) WITH ORDINALITY
                                      AS a(n, m, i)
                                 WHERE m IN ('i', 'b', 'v')),
                                CASE WHEN p.proargmodes IS NULL
                                     THEN p.proargnames[1:p.pronargs] END,
                                '{}')
                FROM pg_proc p JOIN pg_depend d
                  ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'""")
            catalog = {}
            for name, args in cur.fetchall():
                catalog.setdefault(name, []).append(list(args))
            cur.execute("""SELECT name, vartype, min_val, max_val, enumvals
                           FROM pg_settings WHERE name LIKE 'redis\\_lock.%'""")
            ranges = {r[0]: r[1:] for r in cur.fetchall()}
            settings = set(ranges)
            cur.execute("""
                SELECT c.relkind, c.relname FROM pg_class c JOIN pg_depend d
                  ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
                JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'""")
            relations = {("view" if k == "v" else "table", n) for k, n in cur.fetchall()}
            cur.execute("""
                SELECT t.evtname FROM pg_event_trigger t JOIN pg_depend d
                  ON d.classid = 'pg_event_trigger'::regclass AND d.objid = t.oid
                JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'""")
            relations |= {("event trigger", r[0]) for r in cur.fetchall()}
    finally:
        c.close()
    assert len(catalog) >= 20 and len(settings) >= 20
    documented = documented_functions()
    assert set(documented) == set(catalog)
    for name, signatures in catalog.items():
        assert sorted(documented[name]) == sorted(signatures), name
    ref = read("doc/reference.md")
    shown = set(re.findall(r"^\| `(redis_lock\.\w+)` \|", section(ref, "Settings"), re.M))
    # pg_settings hides the passwords (GUC_NO_SHOW_ALL): the definitions in
    # src/*.c name them all (a DefineCustom*Variable call, or an entry of the
    # descriptor table settings.c walks), and the server must know each
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "src", "*", "*.c")):
        text = read(path)
        defined |= set(re.findall(r'DefineCustom\w+Variable\(\s*"(redis_lock\.\w+)"', text))
        defined |= set(re.findall(r'^\s*\.name = "(redis_lock\.\w+)",', text, re.M))
    assert settings <= defined
    c = pg.connect()
    try:
        for name in defined - settings:
            assert testbed.sql_one(c, "SELECT current_setting(%s, true)", (name,)) is not None, name
    finally:
        c.close()
    assert shown == defined
    # the range column is what the server accepts
    for name, rng in re.findall(r"^\| `(redis_lock\.\w+)` \| [^|]* \| ([^|]*) \|",
                                section(ref, "Settings"), re.M):
        if name not in ranges:
            continue
        vartype, lo, hi, enumvals = ranges[name]
        want = {"integer": "%s–%s" % (lo, hi), "bool": "on, off",
                "enum": ", ".join(enumvals or [])}.get(vartype)
        if vartype == "string":
            assert rng.startswith("text"), name
        else:
            assert rng == want, (name, rng, want)
    listed = set(re.findall(r"^\| (view|table|event trigger) `(\w+)` \|",
                            section(ref, "Views and tables"), re.M))
    assert listed == relations


COLUMN = r"[a-z_][a-z0-9_]*(?: [a-z][a-z ]*(?:\[\])?)?"
COLUMN_LIST = re.compile(r"`(%s(?:, %s)+)`" % (COLUMN, COLUMN))


def documented_columns():
    """{function or relation name: [(column, type)]} from the reference: the
    first code span of a row's description that is a list of columns."""
    ref = read("doc/reference.md")
    rows = re.findall(r"^\| `(redis_\w+)\([^)]*\)` \| `(?:SETOF )?record` \| (.*) \|$",
                      section(ref, "Functions"), re.M)
    rows += re.findall(r"^\| (?:view|table) `(\w+)` \| (.*) \|$",
                       section(ref, "Views and tables"), re.M)
    found = {}
    for name, text in rows:
        m = COLUMN_LIST.search(text)
        assert m, "doc/reference.md: no list of columns for %s" % name
        found[name] = [tuple(c.split(" ", 1)) for c in m.group(1).split(", ")]
    return found


def installed_columns(cur):
    """{name: [(column, type)]} of every function of the extension returning
    a record or a set, and of its views and tables, from the catalog."""
    cur.execute("""
        SELECT p.proname, a.n, format_type(a.t, NULL), a.i
        FROM pg_proc p JOIN pg_depend d
          ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
        JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
        CROSS JOIN LATERAL unnest(p.proargnames, p.proallargtypes, p.proargmodes)
             WITH ORDINALITY AS a(n, t, m, i)
        WHERE (p.proretset OR p.prorettype = 'record'::regtype) AND a.m IN ('o', 'b', 't')
        UNION ALL
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnum
        FROM pg_class c JOIN pg_depend d
          ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
        JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'redis_lock'
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relkind IN ('v', 'r')
        ORDER BY 1, 4""")
    found = {}
    for name, column, type_, _ in cur.fetchall():
        found.setdefault(name, []).append((column, type_))
    return found


def test_a_column_list_is_read_with_its_types():
    assert COLUMN_LIST.search("rows: `a text, b double precision, c, d text[]` (x)").group(1) \
        == "a text, b double precision, c, d text[]"
    assert COLUMN_LIST.search("`redis_lock.wait_timeout` then `x, y`").group(1) == "x, y"


def test_reference_lists_every_column_of_records_sets_and_views(pg):
    documented = documented_columns()
    c = pg.connect()
    try:
        with c.cursor() as cur:
            installed = installed_columns(cur)
            # the server reads the reference's type names (timestamptz)
            for name, columns in documented.items():
                typed = []
                for col in columns:
                    if len(col) == 2:
                        cur.execute("SELECT format_type(%s::regtype, NULL)", (col[1],))
                        col = (col[0], cur.fetchone()[0])
                    typed.append(col)
                documented[name] = typed
    finally:
        c.close()
    assert len(installed) >= 8
    assert set(documented) == set(installed)
    for name, columns in installed.items():
        listed = documented[name]
        assert [col[0] for col in listed] == [col[0] for col in columns], name
        for shown, (column, type_) in zip(listed, columns):
            if len(shown) == 2:
                assert shown[1] == type_, (name, column, shown[1], type_)


def errcodes_header():
    pgbin = os.environ.get("PGBIN", testbed.PGBIN)
    pg_config = os.path.join(pgbin, "pg_config")
    if not os.path.exists(pg_config):
        pg_config = "pg_config"
    inc = subprocess.run([pg_config, "--includedir-server"], check=True,
                         capture_output=True, text=True).stdout.strip()
    return read(os.path.join(inc, "utils", "errcodes.h"))


def raised_sqlstates():
    """The SQLSTATEs of every ERRCODE_ name in src/*.c (however the files are
    split) and of every condition name the newest install script raises."""
    sqlstate = {m.group(1): "".join(m.groups()[1:]) for m in re.finditer(
        r"#define (ERRCODE_\w+)\s+MAKE_SQLSTATE\('(.)','(.)','(.)','(.)','(.)'\)",
        errcodes_header())}
    names = set()
    for path in glob.glob(os.path.join(ROOT, "src", "*", "*.c")):
        names |= set(re.findall(r"\b(ERRCODE_[A-Z0-9_]+)\b", read(path)))
    control = read("redis_lock.control")
    version = re.search(r"default_version = '([\d.]+)'", control).group(1)
    script = read("sql/redis_lock--%s.sql" % version)
    for cond in re.findall(r"ERRCODE = '(\w+)'", script):
        # PL/pgSQL's condition names drop errcodes.h's class prefixes
        # (serialization_failure is ERRCODE_T_R_SERIALIZATION_FAILURE)
        macro = "ERRCODE_" + cond.upper()
        if macro not in sqlstate:
            same = [m for m in sqlstate if m.endswith("_" + cond.upper())]
            assert len(same) == 1, cond
            macro = same[0]
        names.add(macro)
    unknown = {n for n in names if n not in sqlstate}
    assert unknown == set()
    return {sqlstate[n] for n in names}


def test_reference_lists_every_sqlstate_raised():
    documented = set(re.findall(r"^\| `([0-9A-Z]{5})` \|",
                                section(read("doc/reference.md"), "SQLSTATEs"), re.M))
    raised = raised_sqlstates()
    assert len(raised) >= 15
    assert documented == raised


# --- every SQL example runs ----------------------------------------------

def sql_blocks(page):
    """(line, code, {marker: value}) for every ```sql block of a page."""
    lines = read(page).split("\n")
    blocks, inside, i = [], False, 0
    while i < len(lines):
        line = lines[i]
        if not inside and line.strip() == "```sql":
            marks, j = {}, i - 1
            while j >= 0 and MARKER.match(lines[j]):
                m = MARKER.match(lines[j])
                assert m.group(1) not in marks, "%s:%d: marker twice" % (page, j + 1)
                marks[m.group(1)] = m.group(2)
                j -= 1
            end = i + 1
            while not FENCE.match(lines[end]):
                end += 1
            blocks.append((i + 1, textwrap.dedent("\n".join(lines[i + 1:end]) + "\n"), marks))
            i = end + 1
            continue
        if FENCE.match(line):
            inside = not inside
        i += 1
    return blocks


def psql(pg, db, code, verbose=False):
    pgbin = os.environ.get("PGBIN", testbed.PGBIN)
    cmd = [os.path.join(pgbin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
           "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", db]
    if verbose:
        cmd += ["-v", "VERBOSITY=verbose"]
    return subprocess.run(cmd, input=code, capture_output=True, text=True,
                          timeout=60 * testbed.TIME_SCALE)


def test_every_sql_example_runs(pg, redis_srv):
    counts = {"run": 0, "fails": 0, "not run": 0, "tested elsewhere": 0}
    problems = []
    for page in PAGES:
        blocks = sql_blocks(page)
        if not blocks:
            continue
        db = "docs_" + re.sub(r"\W", "_", os.path.basename(page)[:-3]).lower()
        admin = pg.connect()
        try:
            with admin.cursor() as cur:
                cur.execute("CREATE DATABASE %s" % db)
        finally:
            admin.close()
        c = pg.connect(dbname=db)
        try:
            with c.cursor() as cur:
                cur.execute("CREATE EXTENSION redis_lock")
        finally:
            c.close()
        for line, code, marks in blocks:
            where = "%s:%d" % (page, line)
            if "snippet" in marks or "file" in marks:
                counts["tested elsewhere"] += 1
                continue
            if "sql not run" in marks:
                assert marks["sql not run"].strip(), where + ": give the reason"
                counts["not run"] += 1
                continue
            redis_srv.client().flushall()
            setup = marks.get("sql setup", "")
            full = (setup + ";\n" if setup else "") + code
            if "sql fails" in marks:
                state = marks["sql fails"]
                assert re.fullmatch(r"[0-9A-Z]{5}", state), where
                r = psql(pg, db, full, verbose=True)
                if r.returncode == 0 or ("ERROR:  %s:" % state) not in r.stderr:
                    problems.append("%s: expected %s, got rc %d %s" % (where, state,
                                                                       r.returncode, r.stderr))
                counts["fails"] += 1
            else:
                r = psql(pg, db, full)
                if r.returncode != 0 or "ERROR" in r.stderr:
                    problems.append("%s: %s" % (where, r.stderr))
                counts["run"] += 1
    print("SQL blocks:", counts)
    assert problems == []
    assert counts["run"] >= 10 and counts["fails"] >= 1
    # the blocks that cannot run stay few
    assert counts["not run"] <= 3


# --- the performance page is generated ------------------------------------

def test_performance_page_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "performance.md"
    out.write_text(read("doc/performance.md"))
    subprocess.run([os.path.join(ROOT, "bench", "report"), "--doc",
                    os.path.join(ROOT, "bench", "published"), str(out)], check=True)
    assert out.read_text() == read("doc/performance.md"), \
        "doc/performance.md differs from bench/report --doc bench/published"
