# redis_lock — PGXS build
#
#   make && sudo make install      build and install into the PostgreSQL found by pg_config
#   make installcheck              pg_regress suite against a running server (see scripts/testbed)
#   .ci/run                        everything: packages, build, servers, every suite

EXTENSION = redis_lock
MODULE_big = redis_lock
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))
DATA = $(wildcard sql/redis_lock--*.sql)
PGFILEDESC = "redis_lock - Redis locks shared between SQL and services"

SHLIB_LINK += -lhiredis -lssl -lcrypto
PG_CPPFLAGS += -I$(srcdir)/src
# -Wextra minus -Wunused-parameter: PostgreSQL 15's own headers (fmgr.h, ilist.h)
# have unused parameters in inline functions.
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Werror

# pg_regress reads <outputdir>/sql/NAME.sql before <inputdir>/sql/NAME.sql; our
# inputs live in sql_tests/ (sql/ holds the install scripts), so the output
# directory gets a sql -> ../sql_tests link and expected files come from ./expected.
REGRESS = init acquire_release scopes with_lock errors settings reconnect lease security
REGRESS_OPTS = --inputdir=. --outputdir=tmp_regress
REGRESS_PREP = regress_prep
EXTRA_CLEAN = tmp_regress

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

.PHONY: regress_prep
regress_prep:
	@mkdir -p tmp_regress
	@ln -sfn ../sql_tests tmp_regress/sql

# PGXS does not track header dependencies: every object depends on the header
$(OBJS): $(wildcard src/*.h)
