/*
 * Link-time stand-ins for the PostgreSQL backend symbols that
 * src/base/settings.c, src/base/url.c and src/net/topology.c use, so their
 * parsers can run in a libFuzzer binary without a server.  Memory goes to
 * malloc (AddressSanitizer watches it);
 * elog/ereport(ERROR) long-jumps to the innermost PG_TRY like the real
 * thing, and aborts when nobody catches it.  Anything that would talk to
 * Redis aborts: the parsers must never get there.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  fuzz/stubs.c
 */
#define _GNU_SOURCE 1
#include "postgres.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "net/net.h"

/* port.h maps the printf family to PostgreSQL's own (libpgport): use libc's */
#undef vsnprintf
#undef snprintf
#undef vfprintf
#undef fprintf
#undef vprintf
#undef printf
#undef sprintf
#undef vsprintf

int pg_vsnprintf(char *str, size_t count, const char *fmt, va_list args) { return vsnprintf(str, count, fmt, args); }
int pg_vfprintf(FILE *stream, const char *fmt, va_list args) { return vfprintf(stream, fmt, args); }

int
pg_snprintf(char *str, size_t count, const char *fmt,...)
{
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vsnprintf(str, count, fmt, ap);
	va_end(ap);
	return n;
}

int
pg_fprintf(FILE *stream, const char *fmt,...)
{
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vfprintf(stream, fmt, ap);
	va_end(ap);
	return n;
}

int
pg_printf(const char *fmt,...)
{
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vfprintf(stdout, fmt, ap);
	va_end(ap);
	return n;
}

/*
 * ---- memory ----
 * Every allocation sits in one list, like a memory context that the harness
 * resets after each input (stub_arena_reset): PostgreSQL code relies on its
 * contexts to free what it does not pfree, so per-input leftovers are not
 * bugs, but they must not pile up over millions of inputs.  The block the
 * caller sees still ends where malloc's does, so AddressSanitizer catches
 * overruns.
 */
MemoryContext CurrentMemoryContext = NULL;
MemoryContext TopMemoryContext = NULL;

typedef struct Chunk
{
	struct Chunk *prev;
	struct Chunk *next;
} Chunk;

static Chunk arena = {&arena, &arena};

static void *
chunk_new(Size size, bool zero)
{
	Chunk	   *c = zero ? calloc(1, sizeof(Chunk) + size) : malloc(sizeof(Chunk) + size);

	if (c == NULL)
	{
		fprintf(stderr, "stub: out of memory (%zu bytes)\n", (size_t) size);
		abort();
	}
	c->next = arena.next;
	c->prev = &arena;
	arena.next->prev = c;
	arena.next = c;
	return c + 1;
}

static void
chunk_unlink(Chunk *c)
{
	c->prev->next = c->next;
	c->next->prev = c->prev;
}

void
stub_arena_reset(void)
{
	while (arena.next != &arena)
	{
		Chunk	   *c = arena.next;

		chunk_unlink(c);
		free(c);
	}
}

void *palloc(Size size) { return chunk_new(size, false); }
void *palloc0(Size size) { return chunk_new(size, true); }
void *palloc_extended(Size size, int flags) { return chunk_new(size, true); }
void *MemoryContextAlloc(MemoryContext c, Size size) { return palloc(size); }
void *MemoryContextAllocZero(MemoryContext c, Size size) { return palloc0(size); }
void *MemoryContextAllocZeroAligned(MemoryContext c, Size size) { return palloc0(size); }

void
pfree(void *p)
{
	Chunk	   *c = ((Chunk *) p) - 1;

	chunk_unlink(c);
	free(c);
}

void *
repalloc(void *p, Size size)
{
	Chunk	   *c = ((Chunk *) p) - 1;
	Chunk	   *n;

	chunk_unlink(c);
	n = realloc(c, sizeof(Chunk) + size);
	if (n == NULL)
		abort();
	n->next = arena.next;
	n->prev = &arena;
	arena.next->prev = n;
	arena.next = n;
	return n + 1;
}

char *
pstrdup(const char *s)
{
	size_t		n = strlen(s);
	char	   *p = palloc(n + 1);

	memcpy(p, s, n + 1);
	return p;
}

char *MemoryContextStrdup(MemoryContext c, const char *s) { return pstrdup(s); }

char *
pnstrdup(const char *s, Size len)
{
	size_t		n = strnlen(s, len);
	char	   *p = palloc(n + 1);

	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

char *
psprintf(const char *fmt,...)
{
	va_list		ap;
	char	   *out = NULL;
	char	   *p;

	va_start(ap, fmt);
	if (vasprintf(&out, fmt, ap) < 0)
		abort();
	va_end(ap);
	p = pstrdup(out);
	free(out);
	return p;
}

size_t
strlcpy(char *dst, const char *src, size_t siz)
{
	size_t		n = strlen(src);

	if (siz > 0)
	{
		size_t		c = n < siz - 1 ? n : siz - 1;

		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return n;
}

/* ---- errors ---- */
sigjmp_buf *PG_exception_stack = NULL;
ErrorContextCallback *error_context_stack = NULL;
volatile sig_atomic_t InterruptPending = false;
volatile uint32 InterruptHoldoffCount = 0;
volatile uint32 CritSectionCount = 0;
char	   *GUC_check_errdetail_string = NULL;
char	   *GUC_check_errmsg_string = NULL;
char	   *GUC_check_errhint_string = NULL;
bool		process_shared_preload_libraries_in_progress = false;

static int	cur_elevel;
/* last error message, for a harness that wants to look at it */
char		stub_last_error[1024];

bool
errstart(int elevel, const char *domain)
{
	cur_elevel = elevel;
	stub_last_error[0] = '\0';
	return elevel >= ERROR;		/* below ERROR: drop the report */
}

bool
errstart_cold(int elevel, const char *domain)
{
	return errstart(elevel, domain);
}

static void
keep_message(const char *fmt, va_list ap)
{
	vsnprintf(stub_last_error, sizeof(stub_last_error), fmt, ap);
}

int
errmsg_internal(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	keep_message(fmt, ap);
	va_end(ap);
	return 0;
}

int
errmsg(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	keep_message(fmt, ap);
	va_end(ap);
	return 0;
}

int errcode(int sqlerrcode) { return 0; }
int errcode_for_file_access(void) { return 0; }
int errdetail(const char *fmt,...) { return 0; }
int errhint(const char *fmt,...) { return 0; }
int errdetail_internal(const char *fmt,...) { return 0; }
int errdetail_log(const char *fmt,...) { return 0; }
int errdetail_plural(const char *fmt_singular, const char *fmt_plural, unsigned long n,...) { return 0; }
int errhint_plural(const char *fmt_singular, const char *fmt_plural, unsigned long n,...) { return 0; }
int errcontext_msg(const char *fmt,...) { return 0; }
int set_errcontext_domain(const char *domain) { return 0; }
int errmsg_plural(const char *fmt_singular, const char *fmt_plural, unsigned long n,...) { return 0; }

void
errfinish(const char *filename, int lineno, const char *funcname)
{
	if (cur_elevel < ERROR)
		return;
	if (PG_exception_stack != NULL)
		siglongjmp(*PG_exception_stack, 1);
	fprintf(stderr, "stub: uncaught ERROR at %s:%d (%s): %s\n",
			filename, lineno, funcname, stub_last_error);
	abort();
}

void
pg_re_throw(void)
{
	if (PG_exception_stack != NULL)
		siglongjmp(*PG_exception_stack, 1);
	abort();
}

void FlushErrorState(void) { }

void
pre_format_elog_string(int errnumber, const char *domain)
{
}

char *
format_elog_string(const char *fmt,...)
{
	static char buf[2048];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return buf;
}

void
ProcessInterrupts(void)
{
	abort();
}

/* ---- GUC registration: nothing to register in a fuzzer ---- */
void DefineCustomStringVariable(const char *n, const char *s, const char *l, char **v, const char *b, GucContext c, int f, GucStringCheckHook ch, GucStringAssignHook a, GucShowHook sh) { }
void DefineCustomIntVariable(const char *n, const char *s, const char *l, int *v, int b, int mi, int ma, GucContext c, int f, GucIntCheckHook ch, GucIntAssignHook a, GucShowHook sh) { }
void DefineCustomBoolVariable(const char *n, const char *s, const char *l, bool *v, bool b, GucContext c, int f, GucBoolCheckHook ch, GucBoolAssignHook a, GucShowHook sh) { }
void DefineCustomEnumVariable(const char *n, const char *s, const char *l, int *v, int b, const struct config_enum_entry *o, GucContext c, int f, GucEnumCheckHook ch, GucEnumAssignHook a, GucShowHook sh) { }
void MarkGUCPrefixReserved(const char *className) { }

/* ---- time, latch: parsers never wait ---- */
TimestampTz GetCurrentTimestamp(void) { return 0; }
struct Latch *MyLatch = NULL;
int WaitLatch(Latch *latch, int wakeEvents, long timeout, uint32 wait_event_info) { abort(); }
void ResetLatch(Latch *latch) { abort(); }
uint32 rl_wait_event(RLWaitKind kind) { abort(); }

/* ---- resolve.c: the formatter never connects ---- */
int rl_resolve(const char *host, int port, TimestampTz deadline, RLAddr **out, char **why) { abort(); }

/* ---- transport.c: parsers never talk to Redis ---- */
RLConn *rl_conn_for(const RLEndpoint *ep, bool subscriber) { abort(); }
const char *rl_conn_label(RLConn *conn) { abort(); }
void rl_call_set(RLCall *call, RLConn *conn, int argc, const char **argv, const size_t *argvlen) { abort(); }
void rl_run(RLCall *calls, int ncalls, RLRunMode mode, int timeout_ms) { abort(); }
void rl_call_fail(RLCall *call, RLFailure failure, int sqlstate, char *reason) { abort(); }
char *rl_call_problem(const RLCall *call) { abort(); }
void rl_raise_call_error(RLCall *call) { abort(); }
bool rl_reply_is_error(RLReply *r, const char *prefix) { abort(); }
bool rl_reply_fits(const RLReply *r, const char *shape) { abort(); }

int
pg_strcasecmp(const char *s1, const char *s2)
{
	return strcasecmp(s1, s2);
}

/*
 * redis_lock.max_locks, which the reply limits of stream.c scale with, for
 * the harnesses that do not compile settings.c (weak: settings.c's wins)
 */
__attribute__((weak)) int rl_max_locks = 1024;
