"""The release metadata agree with each other and with the SQL: version
(control file, newest install script, META.json, debian/changelog,
CHANGELOG.md), license (LICENSE, META.json, debian/copyright, README) and
the PostgreSQL versions (META.json, debian/pgversions, README)."""
import json
import os
import re

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
    assert re.search(r'#define RL_VERSION\s+"([\d.]+)"', read("src/common.h")).group(1) == control


def test_one_license_everywhere():
    assert "PostgreSQL License" in read("LICENSE")
    assert json.loads(read("META.json"))["license"] == "postgresql"
    assert "License: PostgreSQL" in read("debian/copyright")
    assert "PostgreSQL License" in read("README.md")


def test_one_set_of_postgresql_versions():
    pgversions = read("debian/pgversions").split()
    meta = json.loads(read("META.json"))
    # the majors scripts/matrix tests beside Debian's 15
    assert pgversions == ["13", "15", "18"]
    assert meta["prereqs"]["runtime"]["requires"]["PostgreSQL"].startswith("13.")
    assert "Built and tested on PostgreSQL 13, 15 and 18" in read("README.md")
    assert "Package: postgresql-15-redis-lock" in read("debian/control")
