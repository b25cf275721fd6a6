"""The release metadata agree with each other and with the SQL: version
(control file, newest install script, META.json, debian/changelog,
CHANGELOG.md) and release date (CHANGELOG.md, debian/changelog), license
(LICENSE, META.json, debian/copyright, README) and the PostgreSQL versions
(META.json, debian/pgversions, README); META.json is a PGXN Meta Spec 1.0.0
document, and the PGXN archive (scripts/pgxn-dist) is the tracked tree."""
import email.utils
import json
import os
import re
import subprocess
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_one_version_everywhere():
    control = re.search(r"default_version = '([\d.]+)'", read("redis_lock.control")).group(1)
    scripts = [f for f in os.listdir(os.path.join(ROOT, "sql"))
               if re.fullmatch(r"redis_lock--[\d.]+\.sql", f)]
    newest = max((f[len("redis_lock--"):-len(".sql")] for f in scripts),
                 key=lambda v: [int(x) for x in v.split(".")])
    meta = json.loads(read("META.json"))
    deb = re.match(r"redis-lock \(([\d.]+)", read("debian/changelog")).group(1)
    changelog = re.search(r"^## ([\d.]+)", read("CHANGELOG.md"), re.M).group(1)
    assert newest == control == changelog
    assert meta["version"] == meta["provides"]["redis_lock"]["version"] == control + ".0" == deb
    assert meta["provides"]["redis_lock"]["file"] == "sql/redis_lock--%s.sql" % control
    # what PostgreSQL 18's pg_get_loaded_modules() reports (PG_MODULE_MAGIC_EXT)
    assert re.search(r'#define RL_VERSION\s+"([\d.]+)"', read("src/base/base.h")).group(1) == control


def test_the_release_is_dated():
    # the newest CHANGELOG.md section is a release, not "unreleased", dated
    # as the Debian changelog's top entry, whose version is META.json's
    newest = re.search(r"^## (.*)$", read("CHANGELOG.md"), re.M).group(1)
    m = re.fullmatch(r"([\d.]+) — (\d{4}-\d{2}-\d{2})", newest)
    assert m, "the newest CHANGELOG.md section is not dated: %r" % newest
    top = re.split(r"\n(?=\S)", read("debian/changelog"))[0]     # an entry starts at column 0
    assert re.match(r"redis-lock \(([\d.]+)\)", top).group(1) == json.loads(read("META.json"))["version"]
    trailer = re.search(r"^ -- .+ <.+>  (.+)$", top, re.M).group(1)
    assert email.utils.parsedate_to_datetime(trailer).date().isoformat() == m.group(2)
    assert json.loads(read("META.json"))["release_status"] == "stable"


SEMVER = r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"


def test_meta_json_follows_the_pgxn_meta_spec():
    # PGXN Meta Spec 1.0.0 (https://pgxn.org/meta/spec.txt): its required
    # keys, the types of the keys used, and no other keys than its own and x_
    meta = json.loads(read("META.json"))
    required = {"name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"}
    optional = {"description", "generated_by", "tags", "no_index", "prereqs",
                "release_status", "resources"}
    assert required <= set(meta)
    assert {k for k in meta if not k.lower().startswith("x_")} <= required | optional
    assert meta["meta-spec"] == {"version": "1.0.0", "url": "https://pgxn.org/meta/spec.txt"}
    assert re.fullmatch(r"[^\s/\\]{2,}", meta["name"])
    assert re.fullmatch(SEMVER, meta["version"])
    assert isinstance(meta["abstract"], str) and meta["abstract"]
    assert meta["maintainer"] and all(isinstance(m, str) and m for m in meta["maintainer"])
    assert meta["release_status"] in ("stable", "testing", "unstable")
    assert all(isinstance(t, str) and 0 < len(t) < 256 for t in meta["tags"])
    for ext, spec in meta["provides"].items():
        assert {"file", "version"} <= set(spec) <= {"file", "version", "abstract", "docfile"}
        assert re.fullmatch(SEMVER, spec["version"])
        assert os.path.isfile(os.path.join(ROOT, spec["file"]))
    for phase, relations in meta["prereqs"].items():
        assert phase in ("configure", "build", "test", "runtime", "develop")
        for relation, needs in relations.items():
            assert relation in ("requires", "recommends", "suggests", "conflicts")
            assert all(v == 0 or re.fullmatch(SEMVER, v) for v in needs.values())


def test_the_pgxn_archive_is_the_tracked_tree(tmp_path):
    # what `pgxn install` unpacks: one top directory <name>-<version>/ with
    # every file git tracks, as it is in the work tree, and nothing else
    meta = json.loads(read("META.json"))
    top = "%s-%s/" % (meta["name"], meta["version"])
    out = subprocess.run([os.path.join(ROOT, "scripts", "pgxn-dist"), str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    assert out == "%s\n" % (tmp_path / (top[:-1] + ".zip"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split("\0")[:-1]
    with zipfile.ZipFile(out.strip()) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        assert all(n.startswith(top) for n in z.namelist())
        assert sorted(n[len(top):] for n in names) == sorted(tracked)
        for n in (top + "META.json", top + "Makefile", top + "redis_lock.control"):
            assert z.read(n).decode() == read(n[len(top):])


def test_one_license_everywhere():
    assert "PostgreSQL License" in read("LICENSE")
    assert json.loads(read("META.json"))["license"] == "postgresql"
    assert "License: PostgreSQL" in read("debian/copyright")
    assert "PostgreSQL License" in read("README.md")


def compatibility_section():
    # the last section of doc/operations.md
    page = read("doc/operations.md")
    return page[page.index("\n## Compatibility"):]


def matrix_list(name):
    return re.search(r"^%s=\(([^)]*)\)" % name, read("scripts/matrix"), re.M).group(1).split()


def test_one_set_of_postgresql_versions():
    # the majors CI tests: Debian 12's 15 (.ci/run), those scripts/matrix
    # builds or unpacks here, Debian 13's own in its chroot and
    # experimental's in the sid chroot
    chroots = [re.search(r"^%s_MAJOR=(\d+)$" % n, read("scripts/matrix"), re.M).group(1)
               for n in ("TRIXIE", "SID")]
    tested = sorted(set(matrix_list("MAJORS") + chroots + ["15"]), key=int)
    assert tested == ["13", "15", "16", "17", "18", "19"]
    assert read("debian/pgversions").split() == tested
    meta = json.loads(read("META.json"))
    assert meta["x_tested_postgresql"] == tested
    assert meta["prereqs"]["runtime"]["requires"]["PostgreSQL"] == tested[0] + ".0.0"
    assert meta["prereqs"]["build"]["requires"]["PostgreSQL"] == tested[0] + ".0.0"
    assert ("Built and tested on PostgreSQL %s and %s" % (", ".join(tested[:-1]), tested[-1])
            in read("README.md"))
    # doc/operations.md's table of majors is the matrix: one row per tested major
    compat = compatibility_section()
    assert sorted(set(re.findall(r"^\| (\d+)\b", compat, re.M)), key=int) == tested
    # bookworm's package is built for its 15 (debian/control is bookworm's)
    assert "Package: postgresql-15-redis-lock" in read("debian/control")


def test_the_servers_in_the_readme_are_the_matrix():
    compat = compatibility_section()
    listed = set(re.findall(r"^\| (Redis|Valkey) (\d+\.\d+)", compat, re.M))
    matrix = {(n.split("-")[0].capitalize(), n.split("-")[1]) for n in matrix_list("SERVERS")}
    # Redis 7.0 is bookworm's, where everything runs
    assert listed == matrix | {("Redis", "7.0")}


def test_the_documentation_is_shipped_and_named():
    # PGXN renders the extension's docfile: the SQL reference; the Debian
    # package installs doc/ beside the README that links into it
    meta = json.loads(read("META.json"))
    docfile = meta["provides"]["redis_lock"]["docfile"]
    assert docfile == "doc/reference.md" and os.path.isfile(os.path.join(ROOT, docfile))
    assert re.search(r"^\tdh_installdocs README\.md CHANGELOG\.md doc$",
                     read("debian/rules"), re.M)
