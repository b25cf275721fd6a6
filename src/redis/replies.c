/*-------------------------------------------------------------------------
 *
 * replies.c
 *	  Owns the decoding of the replies of every form of a lock operation,
 *	  scripted or script-free: grants, flags, found leases, inspection,
 *	  which call of a unit failed or may have run, and what an error reply
 *	  proves (nothing ran; a refusal that would come again) and the
 *	  SQLSTATE it gets.  Each operation declares the reply shapes it
 *	  accepts (the SHAPE_* below, in rl_reply_fits' grammar), and no
 *	  decoder reads an element, a string or an integer of a reply that
 *	  did not fit them.
 *
 *	  Must not: build or send commands, keep state about held locks or
 *	  waits, or decide anything from the answers of several nodes (lockop.c
 *	  does).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/redis/replies.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <hiredis/hiredis.h>

#include "net/net.h"
#include "redis/redis_int.h"

/* ----------------------------------------------------------------
 * The shapes each operation accepts (rl_reply_fits), from the scripts'
 * returns (lockscripts.c, semscripts.c) and the script-free forms' commands (scriptfree.c)
 * ----------------------------------------------------------------
 */
/* {1, fence} | {0, pttl[, publishes]} | {-1, type} */
#define SHAPE_ACQUIRE		"[i i]|[i i i]|[i t]"
/* {1, fence...} | {0, index, pttl, publishes} | {-1, index, type} | {-2, index} */
#define SHAPE_ACQUIRE_MANY	"[i i i*]|[i i t]"
/* release, extend, renew, force, dequeue: n | {-1, type} */
#define SHAPE_FLAG			"i|[i t]"
/* {type} | {type, pttl, a string's value} | {type, pttl, a hash's holders} */
#define SHAPE_INSPECT		"[t]|[t i s]|[t i [s*]]"
/* a semaphore's status: {exists, free, taken} | {-1, type} */
#define SHAPE_SEM_STATUS	"[i i i]|[i t]"
/* a semaphore's set-up: 1 set, 0 it had a count | {-1, type} */
#define SHAPE_SEM_SETUP		"i|[i t]"
/*
 * EXEC of the script-free acquire: SET ... GET (nil: set; the value found;
 * WRONGTYPE), [SET NX of the counter, its INCR (an error: not a counter),]
 * PTTL, TYPE
 */
#define SHAPE_FREE_ACQUIRE	"[(n|s|e) i t]"
#define SHAPE_FREE_ACQUIRE_FENCED "[(n|s|e) (t|n) (i|e) i t]"
/* EXEC of the script-free inspect: TYPE, PTTL, GETRANGE, HRANDFIELD */
#define SHAPE_FREE_INSPECT	"[t i ? ?]"

/* ----------------------------------------------------------------
 * Replies
 * ----------------------------------------------------------------
 */
static bool
is_text(const RLReply *r)
{
	return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
}

/* The head of a unit runs a script (EVALSHA, or EVAL after NOSCRIPT) */
static bool
is_script_unit(const RLCall *unit)
{
	return unit->argc > 0 &&
		(pg_strcasecmp(unit->argv[0], "EVALSHA") == 0 ||
		 pg_strcasecmp(unit->argv[0], "EVAL") == 0);
}

/* A string or status reply of exactly these bytes (no NUL hidden in it) */
static bool
bytes_are(const RLReply *r, const char *text)
{
	return is_text(r) && r->len == strlen(text) && memcmp(r->str, text, r->len) == 0;
}

static bool
is_status(const RLReply *r, const char *text)
{
	return r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, text) == 0;
}

/*
 * The array EXEC answered for a MULTI ... EXEC unit of n calls, once MULTI
 * said OK and every command in between QUEUED, if it fits shape; NULL
 * otherwise (a command refused while queued -- an ACL, a redirection --
 * aborts the transaction: nothing of it ran).
 */
static RLReply *
exec_reply(RLCall *unit, int n, const char *shape)
{
	RLReply    *r = unit[n - 1].reply;
	int			i;

	if (n < 3 || !is_status(unit[0].reply, "OK"))
		return NULL;
	for (i = 1; i < n - 1; i++)
		if (!is_status(unit[i].reply, "QUEUED"))
			return NULL;
	if (!rl_reply_fits(r, shape) || r->elements != (size_t) (n - 2))
		return NULL;
	return r;
}

/*
 * The script-free acquire's transaction (rl_free_unit): SET's GET, the fence
 * counter's INCR (when fence), PTTL, TYPE.
 */
static void
free_parse_acquire(RLCall *unit, int n, RLAcquireResult *res)
{
	bool		fence = n == 7;
	RLReply    *x = exec_reply(unit, n, fence ? SHAPE_FREE_ACQUIRE_FENCED :
							   SHAPE_FREE_ACQUIRE);
	RLReply    *got;
	RLReply    *incr;
	RLReply    *pttl;
	RLReply    *type;
	const char *token = unit[1].argv[2];

	if (x == NULL)
		return;
	got = x->element[0];
	incr = fence ? x->element[2] : NULL;
	pttl = x->element[fence ? 3 : 1];
	type = x->element[fence ? 4 : 2];
	if (got->type == REDIS_REPLY_ERROR)
	{
		if (strncmp(got->str, "WRONGTYPE", 9) == 0 && strcmp(type->str, "string") != 0)
		{
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = type->str;
		}
		return;
	}
	if (got->type == REDIS_REPLY_STRING && strcmp(got->str, token) != 0)
	{
		res->outcome = RL_ACQ_BUSY;
		res->pttl = pttl->integer;
		res->holder_publishes = strncmp(got->str, RL_TOKEN_MARKER,
										strlen(RL_TOKEN_MARKER)) == 0;
		return;
	}
	/* ours now, or ours already: the counter has counted for us */
	if (incr != NULL && !rl_reply_fits(incr, "i"))
		return;
	res->fence = incr != NULL ? incr->integer : 0;
	res->outcome = got->type == REDIS_REPLY_NIL ? RL_ACQ_GRANTED : RL_ACQ_OURS;
}

/*
 * Decode an acquire unit of n calls into res: granted with its token, ours
 * already (script-free: its lease must be restarted), busy with the
 * holder's pttl, wrong type, or failed (res->failure: the call to blame).
 */
void
rl_parse_acquire(RLCall *unit, int n, RLAcquireResult *res)
{
	RLReply    *r = unit->reply;

	memset(res, 0, sizeof(*res));
	res->outcome = RL_ACQ_FAILED;
	res->failure = rl_unit_failure(RL_OP_ACQUIRE, unit, n);
	if (!is_script_unit(unit))
	{
		free_parse_acquire(unit, n, res);
		if (res->outcome != RL_ACQ_FAILED)
			res->failure = NULL;
		return;
	}
	/* anything but SHAPE_ACQUIRE, or another verdict, failed */
	if (!rl_reply_fits(r, SHAPE_ACQUIRE))
		return;
	switch (r->element[0]->integer)
	{
		case 1:
			if (!rl_reply_fits(r, "[i i]"))
				break;
			res->outcome = RL_ACQ_GRANTED;
			res->fence = r->element[1]->integer;
			break;
		case 0:
			if (!rl_reply_fits(r, "[i i]|[i i i]"))
				break;
			res->outcome = RL_ACQ_BUSY;
			res->pttl = r->element[1]->integer;
			res->holder_publishes = r->elements == 3 && r->element[2]->integer == 1;
			break;
		case -1:
			if (!rl_reply_fits(r, "[i t]"))
				break;
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = r->element[1]->str;
			break;
		default:
			break;
	}
	if (res->outcome != RL_ACQ_FAILED)
		res->failure = NULL;
}

/*
 * Decode a multi-key acquire script's reply for n locks into res (see
 * simple_acquire_many_lua); anything else is failed.
 */
void
rl_parse_acquire_many(RLCall *call, int n, RLAcquireManyResult *res)
{
	RLReply    *r = call->reply;
	size_t		i;

	memset(res, 0, sizeof(*res));
	res->outcome = RL_ACQ_FAILED;
	if (!rl_reply_fits(r, SHAPE_ACQUIRE_MANY))
		return;
	/* only {-1, index, type} has a text */
	if (rl_reply_fits(r, "[i i t]") != (r->element[0]->integer == -1))
		return;
	if (r->element[0]->integer == 1)
	{
		if (r->elements != (size_t) n + 1)
			return;
		res->fences = palloc(sizeof(int64) * n);
		for (i = 0; i < (size_t) n; i++)
			res->fences[i] = r->element[i + 1]->integer;
		res->outcome = RL_ACQ_GRANTED;
		return;
	}
	if (r->element[1]->integer < 1 || r->element[1]->integer > n)
		return;
	res->index = (int) r->element[1]->integer - 1;
	switch (r->element[0]->integer)
	{
		case 0:
			if (r->elements != 4)
				return;
			res->outcome = RL_ACQ_BUSY;
			res->pttl = r->element[2]->integer;
			res->holder_publishes = r->element[3]->integer == 1;
			break;
		case -1:
			if (r->elements != 3)
				return;
			res->outcome = RL_ACQ_WRONGTYPE;
			res->type = r->element[2]->str;
			break;
		case -2:
			if (r->elements != 2)
				return;
			res->outcome = RL_ACQ_BUSY;
			res->lost = true;
			break;
		default:
			break;
	}
}

/*
 * Is this what TYPE answers: a Redis type's name ("string", "hash", ...) or
 * a module type's (nine characters, such as "ReJSON-RL")?
 */
static bool
is_type_name(const RLReply *r)
{
	size_t		i;

	if (!is_text(r) || r->len == 0 || r->len > 32)
		return false;
	for (i = 0; i < r->len; i++)
	{
		char		c = r->str[i];

		if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
			  (c >= 'a' && c <= 'z') || c == '-' || c == '_'))
			return false;
	}
	return true;
}

/*
 * Is holder field v->element[i] one of v->element[0 .. i) too?  A hash's
 * fields are distinct: a node that names one twice would count for two
 * nodes where holders are counted (interface/waits.c).
 */
static bool
listed_before(const RLReply *v, size_t i)
{
	size_t		j;

	for (j = 0; j < i; j++)
		if (v->element[j]->len == v->element[i]->len &&
			memcmp(v->element[j]->str, v->element[i]->str, v->element[i]->len) == 0)
			return true;
	return false;
}

/*
 * Is this an inspect reply in the script's form: {type} for anything that
 * is not a lock, or {type, pttl, owner} for a lock, where a string's owner
 * is its value and a hash's the array of its holder fields, each in an
 * owner form (protocol.c) and none twice?  The script sends nothing else;
 * a reply that is anything else, from a server that is not what it seems,
 * is not used, so that only such forms ever reach a SQL value.
 */
bool
rl_inspect_reply_valid(const RLReply *r)
{
	const RLReply *v;
	size_t		i;
	bool		writer;

	if (!rl_reply_fits(r, SHAPE_INSPECT) || !is_type_name(r->element[0]))
		return false;
	if (r->elements == 1)
		return true;
	if (r->element[1]->integer < 0)
		return false;
	v = r->element[2];
	if (bytes_are(r->element[0], "string"))
		return rl_reply_fits(v, "s") && rl_is_lock_value(v->str, v->len);
	if (!bytes_are(r->element[0], "hash") || !rl_reply_fits(v, "[s*]") ||
		v->elements == 0 || v->elements > RL_LOCK_FIELDS_MAX)
		return false;
	for (i = 0; i < v->elements; i++)
		if (!rl_is_holder_field(v->element[i]->str, v->element[i]->len, &writer) ||
			listed_before(v, i))
			return false;
	return true;
}

/*
 * The holder fields of a hash that HRANDFIELD ... WITHVALUES answered
 * whole (fields and values in turn), as the inspect script makes them: a
 * writer's first; NULL when it is not a lock's hash in the form the script
 * takes (lockscripts.c, inspect).
 */
static RLReply *
free_hash_holders(const RLReply *kv)
{
	RLReply    *holders;
	const RLReply *mode = NULL;
	int			writers = 0;
	size_t		i;

	if (!rl_reply_fits(kv, "[s*]") || kv->elements % 2 != 0 ||
		kv->elements / 2 > RL_LOCK_FIELDS_MAX)
		return NULL;
	holders = palloc0(sizeof(RLReply));
	holders->type = REDIS_REPLY_ARRAY;
	holders->element = palloc(sizeof(RLReply *) * Max(kv->elements / 2, 1));
	for (i = 0; i < kv->elements; i += 2)
	{
		RLReply    *f = kv->element[i];
		RLReply    *v = kv->element[i + 1];
		bool		writer;

		if (bytes_are(f, "mode"))
		{
			if (!bytes_are(v, "read") && !bytes_are(v, "write"))
				return NULL;
			mode = v;
			continue;
		}
		if (!rl_is_holder_field(f->str, f->len, &writer) ||
			!rl_is_hold_count(v->str, v->len))
			return NULL;
		if (writer)
		{
			writers++;
			memmove(holders->element + 1, holders->element,
					sizeof(RLReply *) * holders->elements);
			holders->element[0] = f;
		}
		else
			holders->element[holders->elements] = f;
		holders->elements++;
	}
	if (holders->elements == 0 ||
		(writers > 0) != (mode != NULL && bytes_are(mode, "write")))
		return NULL;
	return holders;
}

/*
 * The inspect reply of a unit of n calls in the script's form (see
 * rl_inspect_reply_valid), or NULL if it has none.  A script-free unit's
 * answers (TYPE, PTTL, GETRANGE, HRANDFIELD, scriptfree.c) are put in that
 * form by the same rules as the script's.
 */
RLReply *
rl_inspect_reply(RLCall *unit, int n)
{
	RLReply    *x;
	RLReply    *out;
	RLReply    *type;
	RLReply    *pttl;
	RLReply    *v = NULL;

	if (is_script_unit(unit))
		return rl_inspect_reply_valid(unit->reply) ? unit->reply : NULL;
	x = exec_reply(unit, n, SHAPE_FREE_INSPECT);
	if (x == NULL)
		return NULL;
	type = x->element[0];
	pttl = x->element[1];
	if (pttl->integer >= 0 && bytes_are(type, "string"))
	{
		/* GETRANGE gave at most RL_LOCK_VALUE_MAX + 1 bytes */
		v = x->element[2];
		if (!rl_reply_fits(v, "s") || !rl_is_lock_value(v->str, v->len))
			v = NULL;
	}
	else if (pttl->integer >= 0 && bytes_are(type, "hash"))
		v = free_hash_holders(x->element[3]);
	out = palloc0(sizeof(RLReply));
	out->type = REDIS_REPLY_ARRAY;
	out->elements = v != NULL ? 3 : 1;
	out->element = palloc(sizeof(RLReply *) * 3);
	out->element[0] = type;
	out->element[1] = pttl;
	out->element[2] = v;
	return rl_inspect_reply_valid(out) ? out : NULL;
}

/*
 * The call whose reply answers for a script-free unit of n calls: EXEC of a
 * transaction, the SET of a renewal (after its PTTL), else the first.
 */
static RLCall *
free_answer(RLOpKind kind, RLCall *unit, int n)
{
	if (pg_strcasecmp(unit->argv[0], "MULTI") == 0)
		return &unit[n - 1];
	if (kind == RL_OP_RENEW)
		return &unit[1];
	return unit;
}

/*
 * The call to blame when a unit of n calls gave no usable answer: the first
 * that failed or got an error (a transaction's refused command rather than
 * its EXECABORT), else the one whose reply made no sense.
 */
RLCall *
rl_unit_failure(RLOpKind kind, RLCall *unit, int n)
{
	int			i;

	if (is_script_unit(unit))
		return unit;
	for (i = 0; i < n; i++)
		if (unit[i].error != NULL || rl_reply_is_error(unit[i].reply, NULL))
			return &unit[i];
	return free_answer(kind, unit, n);
}

/* ----------------------------------------------------------------
 * Error replies: what they prove
 * ----------------------------------------------------------------
 */

static bool
error_starts(const RLReply *r, const char *prefix)
{
	return strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/*
 * Was error reply r raised while a script ran?  Every such error says
 * where in the script: Redis 6 "Error running script (call to f_<sha>):
 * @user_script:N: ...", Redis 7 and later and Valkey "... script: <sha>,
 * on @user_script:N." (also for a command the script called that the ACL
 * denies: "ACL failure in script: ...", in Redis 7.0 "The user executing
 * the script can't run this command ...").  A refusal of EVALSHA itself,
 * before the script started, has no such mark.
 */
static bool
raised_in_script(const RLReply *r)
{
	return strstr(r->str, "@user_script") != NULL;
}

/*
 * Does error reply r prove that the command it answers changed nothing?
 * Only the refusals Redis makes before it runs a command do: the ACL
 * denies the command or one of its keys (NOPERM), the server does not know
 * the command or its arguments are wrong, no script has that SHA1
 * (NOSCRIPT), a redirection or a node that is no usable master
 * (rl_reply_goes_again), another script is running (BUSY).  And OOM,
 * wherever it comes from: Redis refuses a script's write for memory only
 * while the script has written nothing.  Any other error may have come
 * after a write: one raised while a script ran (a corrupted fence counter:
 * the simple acquire's SET ran, its INCR failed; Redis keeps what a script
 * wrote before it failed), or one of something between us and Redis.
 */
bool
rl_reply_proves_not_run(const RLReply *r)
{
	static const char *const refusals[] = {"NOPERM", "NOSCRIPT", "BUSY ",
		"ERR unknown command", "ERR wrong number of arguments"};
	int			k;

	if (r == NULL || r->type != REDIS_REPLY_ERROR)
		return false;
	if (error_starts(r, "OOM"))
		return true;
	if (raised_in_script(r))
		return false;
	for (k = 0; k < (int) lengthof(refusals); k++)
		if (error_starts(r, refusals[k]))
			return true;
	return rl_reply_goes_again((RLReply *) r);
}

/*
 * Would the command answered with error r be refused the same way if it
 * were sent again, until an administrator changes something?  An ACL
 * refusal (of the command or a key, or of a command a script calls), a
 * command the server does not know (also one a script calls), wrong
 * arguments, a key of another type.  Not a failure that passes: a
 * redirection, a server loading or out of memory, a lost connection.
 */
bool
rl_reply_is_permanent(const RLReply *r)
{
	static const char *const codes[] = {"NOPERM", "WRONGTYPE",
		"ERR unknown command", "ERR wrong number of arguments"};
	static const char *const in_script[] = {"ACL failure in script",
		"The user executing the script can't", "command called from script"};
	int			k;

	if (r == NULL || r->type != REDIS_REPLY_ERROR)
		return false;
	for (k = 0; k < (int) lengthof(codes); k++)
		if (error_starts(r, codes[k]))
			return true;
	for (k = 0; k < (int) lengthof(in_script); k++)
		if (strstr(r->str, in_script[k]) != NULL)
			return true;
	return false;
}

/*
 * The SQLSTATE a caller gets for error reply r: a server that cannot take
 * the command now (08006), an ACL refusal (42501), a key of another type
 * (42809), out of memory (53000); anything else is Redis' own (38000).
 */
int
rl_error_reply_sqlstate(const RLReply *r)
{
	if (error_starts(r, "OOM"))
		return ERRCODE_INSUFFICIENT_RESOURCES;
	if (error_starts(r, "READONLY") || error_starts(r, "MASTERDOWN") ||
		error_starts(r, "LOADING") || error_starts(r, "BUSY") ||
		error_starts(r, "CLUSTERDOWN") || error_starts(r, "TRYAGAIN"))
		return ERRCODE_CONNECTION_FAILURE;
	/*
	 * An ACL refusal: NOPERM for a command, "can't run this command" (Redis
	 * 7.0) or "ACL failure in script" (Redis 7.2+, Valkey) for one inside a
	 * script
	 */
	if (error_starts(r, "NOPERM") ||
		strstr(r->str, "can't run this command") != NULL ||
		strstr(r->str, "ACL failure in script") != NULL)
		return ERRCODE_INSUFFICIENT_PRIVILEGE;
	if (error_starts(r, "WRONGTYPE"))
		return ERRCODE_WRONG_OBJECT_TYPE;
	return ERRCODE_EXTERNAL_ROUTINE_EXCEPTION;
}

/*
 * May a unit of n calls that gave no usable answer have changed something
 * in Redis?  A script that was sent may have run part way, unless its
 * reply proves it did not start (rl_reply_proves_not_run: a refusal of
 * EVALSHA, NOSCRIPT after which the EVAL sent again was refused, ...).  A
 * script-free unit's single commands each ran whole or not at all, an
 * error meaning not; but a transaction whose EXEC answered ran, although a
 * command in it failed: Redis does not roll back the SET before a failed
 * INCR.  And a call sent whose reply never came may have run.
 */
bool
rl_unit_may_have_run(RLCall *unit, int n)
{
	RLReply    *x = unit[n - 1].reply;
	int			i;

	if (is_script_unit(unit))
	{
		if (rl_reply_proves_not_run(unit->reply))
			return false;
		return unit->sent || unit->reply != NULL;
	}
	for (i = 0; i < n; i++)
		if (unit[i].reply == NULL && unit[i].sent)
			return true;
	return pg_strcasecmp(unit->argv[0], "MULTI") == 0 && n > 1 &&
		rl_reply_fits(x, "[?*]");
}

/*
 * Was a unit of n calls that gave no usable answer refused in a way that
 * would come again (rl_reply_is_permanent), by the call to blame?
 */
bool
rl_unit_refused_for_good(RLOpKind kind, RLCall *unit, int n)
{
	RLCall	   *blame = rl_unit_failure(kind, unit, n);

	return blame->error == NULL && rl_reply_is_permanent(blame->reply);
}

/*
 * What an extend or renew unit that said "ours" found left of the lease, in
 * ms: -1 for no expiry, an unknown one (a script-free extend does not ask),
 * or a reply of another form.
 */
int64
rl_extend_found_ttl(RLOpKind kind, RLCall *unit, int n)
{
	RLReply    *r = unit->reply;

	if (!is_script_unit(unit))
	{
		/* the renewal's PTTL, just before its SET */
		if (kind == RL_OP_RENEW && rl_reply_fits(r, "i") && r->integer >= 0)
			return r->integer;
		return -1;
	}
	if (rl_reply_fits(r, "i") && r->integer >= 2)
		return r->integer - 2;
	return -1;
}

/*
 * The answer of a semaphore's status (kind RL_OP_SEM_STATUS: {exists, free,
 * taken}) or set-up script (RL_OP_SEM_SETUP: an integer, 1 set, 0 it had a
 * count) on one node; NULL with *type set for {-1, type}, a key of another
 * kind; NULL for anything else, the other operation's shape included.
 */
RLReply *
rl_sem_reply(RLOpKind kind, RLCall *unit, char **type)
{
	RLReply    *r = unit->reply;

	Assert(kind == RL_OP_SEM_STATUS || kind == RL_OP_SEM_SETUP);
	*type = NULL;
	if (!rl_reply_fits(r, kind == RL_OP_SEM_STATUS ? SHAPE_SEM_STATUS :
					   SHAPE_SEM_SETUP))
		return NULL;
	if (rl_reply_fits(r, "[i t]"))
	{
		if (r->element[0]->integer == -1)
			*type = r->element[1]->str;
		return NULL;
	}
	return r;
}

/*
 * A script-free force release's first round, the inspect's commands
 * (scriptfree.c): RL_FLAG_SEEN with *text the owner value of a string lock,
 * to delete if it still holds it; RL_FLAG_NO when there is no key;
 * RL_FLAG_WRONGTYPE with *text its type for any key that is not a lock of
 * the simple layout.  A lock is what redis_lock_status shows as one
 * (rl_inspect_reply), as in force_lua.
 */
static RLFlag
free_parse_force(RLCall *unit, int n, char **text)
{
	RLReply    *r = rl_inspect_reply(unit, n);

	if (r == NULL)
		return RL_FLAG_FAILED;
	if (bytes_are(r->element[0], "none"))
		return RL_FLAG_NO;
	if (r->elements != 3 || !bytes_are(r->element[0], "string"))
	{
		*text = r->element[0]->str;
		return RL_FLAG_WRONGTYPE;
	}
	*text = r->element[2]->str;
	return RL_FLAG_SEEN;
}

/*
 * A script-free release, extend, renew or force-delete: its compare said
 * yes or no.  A key of another type is not ours (as in the scripts, whose
 * GET fails on it the same way) and stays untouched.
 */
static RLFlag
free_parse_flag(RLOpKind kind, RLCall *unit, int n, char **text)
{
	RLReply    *r = free_answer(kind, unit, n)->reply;

	if (kind == RL_OP_FORCE)
		return free_parse_force(unit, n, text);
	if (r == NULL)
		return RL_FLAG_FAILED;
	if (rl_reply_is_error(r, "WRONGTYPE"))
		return RL_FLAG_NO;
	if (kind == RL_OP_RELEASE)
	{
		if (!rl_reply_fits(r, "i"))
			return RL_FLAG_FAILED;
		return r->integer == 1 ? RL_FLAG_YES : RL_FLAG_NO;
	}
	/* SET ... IFEQ: OK, or nil when the key is not ours (or not there) */
	if (is_status(r, "OK"))
		return RL_FLAG_YES;
	if (rl_reply_fits(r, "n"))
		return RL_FLAG_NO;
	return RL_FLAG_FAILED;
}

/*
 * Decode a release/extend/force unit of n calls: RL_FLAG_YES or
 * RL_FLAG_NO; RL_FLAG_WRONGTYPE with *text the type when the key has a
 * foreign type; RL_FLAG_SEEN with *text the token (script-free force);
 * RL_FLAG_FAILED when the round trip failed or the reply makes no sense.
 */
RLFlag
rl_parse_flag(RLOpKind kind, RLCall *unit, int n, char **text)
{
	RLReply    *r = unit->reply;

	*text = NULL;
	if (!is_script_unit(unit))
		return free_parse_flag(kind, unit, n, text);
	if (!rl_reply_fits(r, SHAPE_FLAG))
		return RL_FLAG_FAILED;
	if (rl_reply_fits(r, "i"))
		return r->integer ? RL_FLAG_YES : RL_FLAG_NO;
	if (r->element[0]->integer == -1)
	{
		*text = r->element[1]->str;
		return RL_FLAG_WRONGTYPE;
	}
	return RL_FLAG_FAILED;
}

