"""Issue 32, item 5: Redis passwords must not be readable by other roles.

A password set per role, per database or per function (ALTER ROLE/ALTER
DATABASE ... SET, CREATE FUNCTION ... SET) is stored in pg_db_role_setting or
pg_proc, which every role can read. redis_lock refuses to store
redis_lock.password and redis_lock.sentinel_password there (a URL with a
password is refused everywhere), ignores with a WARNING a value stored there
before, and offers redis_lock.password_file instead: a file of
host:port:user:password lines readable only by the server's OS user, used by
backends and by the watchdog worker alike.

The reader is a role with LOGIN only, against real servers; each test failed
on the code before the change (see the report of the change).
"""
import os
import pwd
import re

import psycopg2
import pytest

import testbed

SECRETS = {"redis_lock.password": "s3cret-Master-9f2",
           "redis_lock.sentinel_password": "s3cret-Sentinel-41c"}
# URLs with a password (refused everywhere) and without (accepted)
URL_SECRET = "UrlPw-77d1"
URL_SETTINGS = {"redis_lock.url": "redis://app:%s@127.0.0.1:6390/0",
                "redis_lock.nodes": "redis://127.0.0.1:6391,redis://app:%s@127.0.0.1:6392",
                "redis_lock.sentinels": "redis://app:%s@127.0.0.1:26390"}
ACL_USER, ACL_PASSWORD = "locker", "lo:ck\\er-pw"      # a ":" and a "\" to escape


def write_private(path, text, mode=0o600):
    """A file owned by the server's OS user, with the given mode."""
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(testbed.RLTEST_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def escape(field):
    return field.replace("\\", "\\\\").replace(":", "\\:")


def setup_roles(admin):
    cur = admin.cursor()
    for role in ("rl_intruder", "rl_app", "rl_app_old", "rl_app_placeholder"):
        cur.execute("DROP ROLE IF EXISTS %s" % role)
        cur.execute("CREATE ROLE %s LOGIN" % role)


def catalog_text(conn):
    """Everything a role can read of stored settings: pg_db_role_setting,
    pg_roles.rolconfig, pg_proc.proconfig."""
    return testbed.sql_one(conn, """
        SELECT concat_ws(' ',
          (SELECT string_agg(array_to_string(setconfig, ' '), ' ') FROM pg_db_role_setting),
          (SELECT string_agg(array_to_string(rolconfig, ' '), ' ') FROM pg_roles),
          (SELECT string_agg(array_to_string(proconfig, ' '), ' ') FROM pg_proc))""")


@pytest.fixture(scope="module")
def redis_pw():
    """A Redis whose default user needs SECRETS['redis_lock.password'], and
    an ACL user whose password holds characters the file escapes."""
    r = testbed.Redis(password=SECRETS["redis_lock.password"]).start()
    r.client().execute_command("ACL", "SETUSER", ACL_USER, "reset", "on", ">" + ACL_PASSWORD,
                               "~*", "&*", "+@all")
    yield r
    r.stop()


@pytest.fixture(scope="module")
def pg(redis_pw):
    """Preloaded, no password in any setting."""
    p = testbed.Postgres(conf={"redis_lock.url": redis_pw.url}).init().start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


# ====================================================== refused in catalogs

def test_secrets_are_not_stored_where_every_role_reads_them(pg, redis_pw):
    admin = pg.connect()
    cur = admin.cursor()
    stored, echoed = [], []

    def attempt(sql, secret):
        try:
            cur.execute(sql)
        except psycopg2.Error as e:
            assert e.pgcode == "22023", (sql, e.pgcode, str(e))
            if secret in str(e):
                echoed.append(str(e))
            return str(e)
        stored.append(sql)
        return None

    for name, secret in SECRETS.items():
        for target in ("ROLE rl_app", "ROLE rl_app IN DATABASE postgres",
                       "DATABASE postgres", "ROLE ALL"):
            err = attempt("ALTER %s SET %s = '%s'" % (target, name, secret), secret)
            if err is not None:
                assert "cannot be set per role, per database or per function" in err
                assert "redis_lock.password_file" in err          # the hint
        attempt("CREATE FUNCTION rl_f_%s() RETURNS int LANGUAGE sql SET %s = '%s' AS 'SELECT 1'"
                % (name.split(".")[1], name, secret), secret)
        # FROM CURRENT stores the session's value: refused as well
        cur.execute("SET %s = '%s'" % (name, secret))
        attempt("ALTER ROLE rl_app SET %s FROM CURRENT" % name, secret)
        cur.execute("RESET %s" % name)
        # an empty one carries no secret and may be stored
        cur.execute("ALTER ROLE rl_app SET %s = ''" % name)
        cur.execute("ALTER ROLE rl_app RESET %s" % name)
    for name, url in URL_SETTINGS.items():
        attempt("ALTER ROLE rl_app SET %s = '%s'" % (name, url % URL_SECRET), URL_SECRET)
        # the same URL without the password is a valid setting
        cur.execute("ALTER ROLE rl_app SET %s = '%s'" % (name, url.replace(":%s", "")))
        cur.execute("ALTER ROLE rl_app RESET %s" % name)

    # not stored in a catalog, so still allowed: a session's SET, and
    # ALTER SYSTEM (postgresql.auto.conf, PGC_S_FILE)
    cur.execute("SET redis_lock.password = %s", (SECRETS["redis_lock.password"],))
    assert testbed.sql_one(admin, "SELECT redis_lock_acquire('session-pw')") > 0
    assert testbed.sql_one(admin, "SELECT redis_lock_release('session-pw')") is True
    cur.execute("RESET redis_lock.password")
    cur.execute("ALTER SYSTEM SET redis_lock.sentinel_password = %s",
                (SECRETS["redis_lock.sentinel_password"],))
    cur.execute("ALTER SYSTEM RESET redis_lock.sentinel_password")
    # a URL's refusal says why (asserted last)
    url_err = attempt("SET redis_lock.url = '%s'"
                      % (URL_SETTINGS["redis_lock.url"] % URL_SECRET), URL_SECRET)

    # what a LOGIN-only role can read of every stored setting
    intruder = pg.connect(user="rl_intruder")
    seen = catalog_text(intruder)
    intruder.close()
    leaked = [s for s in list(SECRETS.values()) + [URL_SECRET] if s in (seen or "")]
    for sql in stored:                          # leave nothing for later tests
        if sql.startswith("CREATE FUNCTION"):
            cur.execute("DROP FUNCTION %s()" % sql.split()[2].split("(")[0])
        else:
            cur.execute(sql.split(" SET ")[0] + " RESET ALL")
    admin.close()
    assert not stored and not leaked, \
        "a LOGIN-only role read %s; stored in a catalog: %s" % (leaked, stored)
    assert not echoed, "a refusal repeats the secret: %s" % echoed
    assert "carries a password" in url_err and "redis_lock.password_file" in url_err


# ====================================================== stored before

def test_a_password_stored_before_is_ignored_at_login(pg, redis_pw):
    """As an install older than the refusal left it: the value is in
    pg_db_role_setting; at login PostgreSQL warns and does not apply it."""
    secret = SECRETS["redis_lock.password"]
    admin = pg.connect()
    admin.cursor().execute(
        "INSERT INTO pg_db_role_setting VALUES "
        "(0, (SELECT oid FROM pg_roles WHERE rolname = 'rl_app_old'), %s)",
        (["redis_lock.password=" + secret],))
    try:
        app = pg.connect(user="rl_app_old")
        # a WARNING at login (before psycopg2 collects notices: in the log)
        pid = testbed.sql_one(app, "SELECT pg_backend_pid()")
        assert ('[%d] WARNING:  parameter "redis_lock.password" cannot be set per role' % pid
                in pg.log_text())
        # not applied: without it the Redis refuses us
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(app, "SELECT redis_lock_acquire('old-pw')")
        assert ei.value.pgcode == "28000", str(ei.value)
        assert secret not in str(ei.value)
        app.close()
        assert not [line for line in pg.log_text().splitlines()
                    if "[%d]" % pid in line and secret in line]
    finally:
        admin.cursor().execute("ALTER ROLE rl_app_old RESET ALL")
        admin.close()


@pytest.fixture(scope="module")
def plain(redis_pw):
    """Not preloaded: the module loads when a session first uses it; the
    right password in postgresql.conf."""
    p = testbed.Postgres(preload=False, conf={
        "redis_lock.url": redis_pw.url,
        "redis_lock.password": SECRETS["redis_lock.password"]}).init().start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


def test_a_placeholder_stored_before_the_module_loaded_is_ignored(plain):
    """PostgreSQL cannot check a value stored by a session that has not
    loaded the module; when the module loads in a session that got it at
    login, the value is refused (WARNING)."""
    secret = SECRETS["redis_lock.password"]
    admin = plain.connect()           # has not loaded the module: stored unchecked
    admin.cursor().execute("ALTER ROLE rl_app_placeholder SET redis_lock.password = %s",
                           (secret,))
    admin.close()
    try:
        app = plain.connect(user="rl_app_placeholder")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(app, "SELECT redis_lock_acquire('placeholder-pw')")
        assert ei.value.pgcode == "28000", str(ei.value)
        assert any("cannot be set per role" in n for n in app.notices), app.notices
        assert not any(secret in n for n in app.notices)
        app.close()
    finally:
        admin = plain.connect()
        admin.cursor().execute("ALTER ROLE rl_app_placeholder RESET ALL")
        admin.close()


def test_without_preloading_a_password_in_postgresql_conf_is_refused(plain):
    """Until a session loads the module, postgresql.conf's value is a
    placeholder any role can SHOW; the module then refuses to use it, so
    that such a setup fails rather than works while leaking."""
    secret = SECRETS["redis_lock.password"]
    intruder = plain.connect(user="rl_intruder")
    # (current_setting('redis_lock.password') shows it here: PostgreSQL's
    # placeholder, which the module cannot hide; hence the refusal)
    with pytest.raises(psycopg2.Error) as ei:
        testbed.sql_one(intruder, "SELECT redis_lock_acquire('conf-pw')")
    assert ei.value.pgcode == "28000", str(ei.value)
    assert any("requires redis_lock in shared_preload_libraries" in n and
               "redis_lock.password_file" in n for n in intruder.notices), intruder.notices
    assert not any(secret in n for n in intruder.notices)
    intruder.close()
    # ALTER SYSTEM in a session that has loaded the module is refused too
    admin = plain.connect()
    admin.cursor().execute("LOAD 'redis_lock'")
    with pytest.raises(psycopg2.Error) as ei:
        admin.cursor().execute("ALTER SYSTEM SET redis_lock.sentinel_password = 'x'")
    assert ei.value.pgcode == "22023", str(ei.value)
    admin.close()


# ====================================================== the password file

def doc_example(port):
    """The example of doc/reference.md (Passwords): redis_lock.url and the
    file's text, with the port of our Redis for 6379."""
    ref = open(os.path.join(os.path.dirname(__file__), "..", "doc", "reference.md")).read()
    url = re.search(r"^redis_lock\.url = '([^']*)'", ref, re.M).group(1)
    text = re.search(r"<!-- password-file-example -->\n```text\n(.*?)```", ref, re.S).group(1)
    assert "locker:" + escape(ACL_PASSWORD) in text
    return url.replace(":6379/", ":%d/" % port), text.replace(":6379:", ":%d:" % port)


@pytest.fixture(scope="module")
def pf(redis_pw):
    """Preloaded, redis_lock.url naming the ACL user, its password only in
    redis_lock.password_file: the reference's example, after lines that
    come first and must not match."""
    url, example = doc_example(redis_pw.port)
    p = testbed.Postgres(conf={"redis_lock.url": url}).init()
    path = os.path.join(p.base, "redis.pass")
    p.set_conf(redis_lock__password_file=path)
    p.pwfile = path
    p.write = lambda text, mode=0o600: write_private(path, text, mode)
    p.write("127.0.0.1:1:%(user)s:wrong-port\n"
            "127.0.0.1:%(port)d:someone-else:wrong-user\n"
            "\n" % {"port": redis_pw.port, "user": ACL_USER} + example)
    p.start().with_extension()
    admin = p.connect()
    setup_roles(admin)
    admin.close()
    yield p
    p.cleanup()


def wait_renewed(rclient, key, timeout=15):
    """Poll until key's PTTL goes back up (a renewal); it must exist all along."""
    last = [None]

    def renewed():
        pttl = rclient.pttl(key)
        assert pttl > 0, "%s expired: not renewed" % key
        up = last[0] is not None and pttl > last[0] + 200
        last[0] = pttl
        return up
    testbed.wait_until(renewed, timeout, what="the watchdog to renew %s" % key)


def test_password_file_authenticates_backends_and_the_watchdog(pf, redis_pw):
    intruder = pf.connect(user="rl_intruder")
    cur = intruder.cursor()
    cur.execute("SET redis_lock.lease_time = '3s'")
    assert testbed.sql_one(intruder, "SELECT redis_lock_acquire('pf-lock') > 0")
    assert not intruder.notices, intruder.notices
    rc = redis_pw.client()
    assert rc.exists("pf-lock")
    # only the worker renews (every lease/3): it authenticated with the file too
    wait_renewed(rc, "pf-lock")
    wait_renewed(rc, "pf-lock")
    assert testbed.sql_one(intruder, "SELECT redis_lock_release('pf-lock')") is True
    # the LOGIN-only role reads neither the path's setting nor the password
    with pytest.raises(psycopg2.Error) as ei:
        testbed.sql_one(intruder, "SHOW redis_lock.password_file")
    assert ei.value.pgcode == "42501"
    assert ACL_PASSWORD not in (catalog_text(intruder) or "")
    intruder.close()
    log = pf.log_text()
    assert ACL_PASSWORD not in log and escape(ACL_PASSWORD) not in log


def test_a_password_file_open_to_others_is_ignored(pf):
    pf.write(open(pf.pwfile).read(), mode=0o640)
    try:
        s = pf.connect(user="rl_intruder")      # a new backend: a new connection
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-open')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        assert any("ignoring Redis password file" in n and
                   "accessible by group or others" in n for n in s.notices), s.notices
        s.close()
    finally:
        pf.write(open(pf.pwfile).read(), mode=0o600)


def test_no_matching_line_is_the_usual_authentication_error(pf, redis_pw):
    saved = open(pf.pwfile).read()
    pf.write("127.0.0.1:%d:%s:wrong\n127.0.0.1:%d:%s\n" % (redis_pw.port + 1, ACL_USER,
                                                            redis_pw.port, ACL_USER))
    try:
        s = pf.connect(user="rl_intruder")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-none')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        assert "password authentication failed for Redis" in str(ei.value)
        assert "redis_lock.password_file" in str(ei.value)          # the hint
        # the malformed second line is named by its number, not its text
        assert any("skipping line 2 of Redis password file" in n for n in s.notices), s.notices
        s.close()
    finally:
        pf.write(saved)


def test_password_file_for_sentinels_and_their_master():
    """A Sentinel connection is matched by the Sentinel's host:port, the
    master it names by the master's, each with its own password."""
    master = testbed.Redis(password="master-pw").start()
    sentinel = testbed.Sentinel(master.port, quorum=1)
    with open(sentinel.conf, "a") as f:
        f.write("sentinel auth-pass mymaster master-pw\nrequirepass sentinel-pw\n")
    sentinel.password = "sentinel-pw"
    sentinel.start()
    p = testbed.Postgres(conf={"redis_lock.url": "redis://127.0.0.1:%d/0" % master.port,
                               "redis_lock.sentinels": sentinel.url}).init()
    try:
        path = write_private(os.path.join(p.base, "redis.pass"),
                             "127.0.0.1:%d:default:sentinel-pw\n"
                             "127.0.0.1:%d:*:master-pw\n" % (sentinel.port, master.port))
        p.set_conf(redis_lock__password_file=path)
        p.start().with_extension()
        s = p.connect()
        s.cursor().execute("SET redis_lock.lease_time = '3s'")
        assert testbed.sql_one(s, "SELECT redis_lock_acquire('sentinel-pf') > 0")
        wait_renewed(master.client(), "sentinel-pf")
        assert testbed.sql_one(s, "SELECT redis_lock_release('sentinel-pf')") is True
        s.close()
    finally:
        p.cleanup()
        sentinel.stop()
        master.stop()


def test_a_password_file_that_is_no_regular_file_is_ignored_without_hanging(pf):
    """A FIFO: opened without blocking, refused as not a regular file."""
    fifo = os.path.join(pf.base, "redis.fifo")
    os.mkfifo(fifo, 0o600)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(testbed.RLTEST_USER)
        os.chown(fifo, pw.pw_uid, pw.pw_gid)
    admin = pf.connect()
    pf.set_conf(redis_lock__password_file=fifo)
    pf.reload()
    try:
        testbed.wait_until(lambda: testbed.sql_one(admin, "SHOW redis_lock.password_file") == fifo,
                           what="the reload")
        s = pf.connect(user="rl_intruder")
        s.cursor().execute("SET statement_timeout = '20s'")
        with pytest.raises(psycopg2.Error) as ei:
            testbed.sql_one(s, "SELECT redis_lock_acquire('pf-fifo')")
        assert ei.value.pgcode == "28P01", str(ei.value)
        assert any("ignoring Redis password file" in n and "not a regular file" in n
                   for n in s.notices), s.notices
        s.close()
    finally:
        pf.set_conf(redis_lock__password_file=pf.pwfile)
        pf.reload()
        testbed.wait_until(
            lambda: testbed.sql_one(admin, "SHOW redis_lock.password_file") == pf.pwfile,
            what="the reload")
        admin.close()
