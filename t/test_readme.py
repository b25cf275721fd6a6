"""The client code in the README and in doc/*.md is the code the interop
tests run, and their migrations and procedures are the ones
t/test_migrations.py and t/test_procedures.py run ("the README" below is
README.md and every page of doc/; t/test_docs.py runs their SQL blocks).

A README block introduced by `<!-- snippet: PATH NAME -->` must equal, after
dedenting, the lines between the comments `README: NAME` and `README: end`
in PATH; and every such region of the peers is shown in the README.

A README block introduced by `<!-- file: PATH -->` must equal the whole
file PATH; and every migration file of t/migrations/ (the files the tools
run, and their settings that change how they run) is shown in the README."""
import glob
import os
import re
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["t/test_interop.py", "t/interop/redlock_peer.js",
           "t/interop/redlock_universal_peer.js", "t/interop/go/main.go",
           "t/interop/java/src/main/java/peer/Peer.java",
           "t/interop/spring/src/main/java/peer/SpringPeer.java", "t/test_procedures.py"]
MARK = re.compile(r"^\s*(?://|#|--) README: (\S+)\s*$")
MIGRATION_FILES = ["t/migrations/flyway/flyway.toml", "t/migrations/flyway/sql/*",
                   "t/migrations/liquibase/changelog.sql",
                   "t/migrations/alembic/env.py", "t/migrations/alembic/versions/*.py",
                   "t/migrations/golang-migrate/migrations/*.sql",
                   "t/migrations/sqitch/deploy/*.sql", "t/migrations/sqitch/revert/*.sql"]


def regions(path):
    found, name, body = {}, None, []
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            m = MARK.match(line)
            if m and m.group(1) == "end":
                assert name, "%s: README: end without a start" % path
                found[name] = textwrap.dedent("".join(body))
                name = None
            elif m:
                assert name is None, "%s: region %s not ended" % (path, name)
                name, body = m.group(1), []
            elif name:
                body.append(line)
    assert name is None, "%s: region %s not ended" % (path, name)
    return found


def pages():
    """The text of README.md and of every page of doc/."""
    paths = ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "doc", "*.md")))
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            yield f.read()


def readme_snippets():
    return [s for text in pages()
            for s in re.findall(r"<!-- snippet: (\S+) (\S+) -->\n```\w*\n(.*?)```", text, re.S)]


def test_every_readme_snippet_is_tested_code():
    shown = set()
    # every marker introduces a block (a marker not right above its block
    # would otherwise go unchecked)
    assert len(readme_snippets()) == sum(text.count("<!-- snippet:") for text in pages())
    for path, name, block in readme_snippets():
        code = regions(path).get(name)
        assert code is not None, "README shows %s %s, which the source does not mark" % (path, name)
        assert block == code, "README's %s %s differs from the source" % (path, name)
        shown.add((path, name))
    marked = {(p, n) for p in SOURCES for n in regions(p)}
    assert marked - shown == set(), "marked for the README but not shown"


def readme_files():
    return [s for text in pages()
            for s in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S)]


def test_every_readme_file_is_the_tested_file():
    shown = set()
    assert len(readme_files()) == sum(text.count("<!-- file:") for text in pages())
    for path, block in readme_files():
        with open(os.path.join(ROOT, path)) as f:
            assert block == f.read(), "README's %s differs from the file" % path
        shown.add(path)
    tested = {os.path.relpath(p, ROOT) for pattern in MIGRATION_FILES
              for p in glob.glob(os.path.join(ROOT, pattern))}
    assert len(tested) == 13
    assert tested - shown == set(), "migration files not shown in the README"
