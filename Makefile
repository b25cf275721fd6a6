# redis_lock — PGXS build
#
#   make && sudo make install      build and install into the PostgreSQL found by pg_config
#   make RL_WERROR=1               the same with warnings as errors (what CI builds with)
#   make RL_HIREDIS=/prefix        against the hiredis installed under /prefix
#   make installcheck              pg_regress suite (sql_tests/ against expected/) on a
#                                  running server that has redis_lock installed and
#                                  preloaded, redis_lock.url set to a running Redis,
#                                  PGHOST/PGPORT/PGUSER and RL_REDIS_PORT (the tests
#                                  call redis-cli) in the environment.
#                                  `t/testbed.py up DIR` starts such servers and writes
#                                  those variables to DIR/env; `scripts/run-tests regress`
#                                  does all of it and stops them again.
#   .ci/run                        everything: packages, build, servers, every suite

EXTENSION = redis_lock
MODULE_big = redis_lock
# The objects, by subsystem, each calling only the ones listed after it
# (doc/architecture.md draws them).
OBJS = \
	src/interface/module.o src/interface/shmem.o src/interface/functions.o \
	src/interface/statusfunctions.o src/interface/semfunctions.o \
	src/interface/fenceguard.o src/interface/waits.o \
	src/lock/locktable.o src/lock/lockacquire.o src/lock/lockmany.o \
	src/lock/lockrelease.o src/lock/lockxact.o src/lock/lockdoubts.o \
	src/lock/locklost.o src/lock/lockstate.o \
	src/wait/waitqueue.o src/wait/deadlock.o src/wait/deadlock_graph.o \
	src/wait/waiters.o src/wait/waitend.o \
	src/worker/registry.o src/worker/watchdog.o src/worker/watchjobs.o \
	src/worker/watchevents.o \
	src/redis/lockop.o src/redis/manyop.o src/redis/protocol.o src/redis/scripts.o \
	src/redis/lockscripts.o src/redis/semscripts.o \
	src/redis/scriptfree.o src/redis/replies.o \
	src/net/topology.o src/net/transport.o src/net/handshake.o \
	src/net/connection.o src/net/owed.o src/net/pubsub.o \
	src/net/stream.o src/net/tls.o src/net/resolve.o \
	src/base/settings.o src/base/url.o src/base/passwordfile.o \
	src/base/stats.o
DATA = $(wildcard sql/redis_lock--*.sql)
PGFILEDESC = "redis_lock - Redis locks shared between SQL and services"

SHLIB_LINK += -lhiredis -lssl -lcrypto -lcares
PG_CPPFLAGS += -I$(srcdir)/src
# another hiredis than the system's (scripts/matrix compiles against 1.2)
ifdef RL_HIREDIS
PG_CPPFLAGS += -I$(RL_HIREDIS)/include
SHLIB_LINK := -L$(RL_HIREDIS)/lib $(SHLIB_LINK)
endif
# -Wextra minus -Wunused-parameter: PostgreSQL 15's own headers (fmgr.h, ilist.h)
# have unused parameters in inline functions.
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter
# Warnings are errors only when asked for (CI: .ci/run, scripts/assert-check,
# scripts/memcheck), so that a newer compiler's new warnings never break a
# packager's build.
ifdef RL_WERROR
PG_CFLAGS += -Werror
endif

# pg_regress reads <outputdir>/sql/NAME.sql before <inputdir>/sql/NAME.sql; our
# inputs live in sql_tests/ (sql/ holds the install scripts), so the output
# directory gets a sql -> ../sql_tests link and expected files come from ./expected.
REGRESS = init acquire_release scopes with_lock errors settings reconnect lease rwlock security many
REGRESS_OPTS = --inputdir=. --outputdir=tmp_regress
REGRESS_PREP = regress_prep
# multi-session behaviour as isolation specs (specs/), PostgreSQL's own
# convention; outputs in expected/ too
ISOLATION = contention xact_scope lost_at_commit read_write
ISOLATION_OPTS = --inputdir=. --outputdir=tmp_isolation
EXTRA_CLEAN = tmp_regress tmp_isolation

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

.PHONY: regress_prep
regress_prep:
	@mkdir -p tmp_regress
	@ln -sfn ../sql_tests tmp_regress/sql

# PGXS does not track header dependencies: every object depends on the header
$(OBJS): $(wildcard src/*/*.h)
