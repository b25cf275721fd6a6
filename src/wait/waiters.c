/*-------------------------------------------------------------------------
 *
 * waiters.c
 *	  Owns the published waits that redis_lock_waits shows: every backend
 *	  of this server waiting for a Redis lock, a read or write hold or a
 *	  semaphore's permits writes, from the start of its wait, a record of
 *	  what it waits for (the lock's SQL name, its Redis key, its layout,
 *	  where it lives, since when, and the owner value its grant will have),
 *	  and clears it when the wait ends, however it ends: its end,
 *	  transaction abort, subtransaction abort and backend exit each clear
 *	  it.
 *
 *	  The records are this file's part of the extension's shared-memory
 *	  area (interface/shmem.c lays the parts out): one per process that
 *	  can run SQL, indexed by its PGPROC number, written only by its own
 *	  backend.  A writer never waits: like
 *	  pgstat's st_changecount, a counter is odd while the record changes,
 *	  and a reader copies the record again until it saw the same even count
 *	  before and after its copy.  A wait for a set of locks shows at most
 *	  RL_WAITERS_MAX_KEYS of its keys, and fewer when their names and keys
 *	  fill the record's text (at least one always fits).  Exists only with
 *	  shared_preload_libraries = 'redis_lock'.
 *
 *	  Must not: talk to Redis, raise while it writes a record, wait for
 *	  another backend, or leave a record after its wait.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/wait/waiters.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "wait/wait_int.h"

/*
 * Bytes of one record's strings: its target's spec, each key's name, key
 * and owner value
 */
#define RL_WAITERS_TEXT_LEN	4096

/* One key of a published wait; its strings are offsets into the text */
typedef struct RLWaiterSlotKey
{
	RLProtocol	protocol;
	uint16		name_off;
	uint16		key_off;
	uint16		owner_off;
} RLWaiterSlotKey;

/* What one backend waits for; pid 0: nothing */
typedef struct RLWaiterSlot
{
	uint32		changecount;	/* odd while its backend writes it */
	int			pid;
	TimestampTz since;
	int			nkeys;			/* keys shown (spec is at text[0]) */
	RLWaiterSlotKey keys[RL_WAITERS_MAX_KEYS];
	char		text[RL_WAITERS_TEXT_LEN];
} RLWaiterSlot;

typedef struct RLWaiters
{
	int			nslots;
	RLWaiterSlot slots[FLEXIBLE_ARRAY_MEMBER];
} RLWaiters;

static RLWaiters *waiters = NULL;
static RLWaiterSlot *my_slot = NULL;	/* set while this backend's is used */

/* ----------------------------------------------------------------
 * Shared memory: a part of the extension's area (interface/shmem.c)
 * ----------------------------------------------------------------
 */

/* Room for nslots records (one per process that can run SQL) */
Size
rl_waiters_shmem_size(int nslots)
{
	return add_size(offsetof(RLWaiters, slots),
					mul_size(nslots, sizeof(RLWaiterSlot)));
}

/* The records at area, nslots of them: every one empty when just created */
void
rl_waiters_shmem_init(void *area, int nslots, bool found)
{
	waiters = (RLWaiters *) area;
	if (!found)
	{
		memset(waiters, 0, rl_waiters_shmem_size(nslots));
		waiters->nslots = nslots;
	}
}

/* This backend's record, or NULL when it has none (no preload, aux) */
static RLWaiterSlot *
slot_of_mine(void)
{
	int			procno;

	if (waiters == NULL)
		return NULL;
	procno = rl_wait_my_procno();
	return procno >= 0 && procno < waiters->nslots ? &waiters->slots[procno] : NULL;
}

/* ----------------------------------------------------------------
 * Writing this backend's record
 * ----------------------------------------------------------------
 */
/* Append s to the text at *used; false (nothing written) when it is full */
static bool
put_text(RLWaiterSlot *w, int *used, const char *s, uint16 *off)
{
	size_t		len = strlen(s) + 1;

	if (*used + len > RL_WAITERS_TEXT_LEN)
		return false;
	memcpy(w->text + *used, s, len);
	*off = (uint16) *used;
	*used += len;
	return true;
}

/*
 * Build the record of a wait for keys (nkeys of them, all on one target),
 * names[i] the SQL name of keys[i] and owners[i] its owner value, in w:
 * the keys whose strings fit.
 */
static void
fill_record(RLWaiterSlot *w, const RLWaitKey *keys, const char *const *names,
			const char *const *owners, int nkeys)
{
	int			used = 0;
	uint16		spec_off;
	int			i;

	w->pid = MyProcPid;
	w->since = GetCurrentTimestamp();
	w->nkeys = 0;
	/* no spec, no keys: a key must never be read back as where it lives */
	if (!put_text(w, &used, keys[0].target_spec, &spec_off))
		return;
	for (i = 0; i < nkeys && w->nkeys < RL_WAITERS_MAX_KEYS; i++)
	{
		RLWaiterSlotKey *k = &w->keys[w->nkeys];
		int			before = used;

		if (!put_text(w, &used, names[i], &k->name_off) ||
			!put_text(w, &used, keys[i].key, &k->key_off) ||
			!put_text(w, &used, owners[i], &k->owner_off))
		{
			used = before;
			break;
		}
		k->protocol = keys[i].protocol;
		w->nkeys++;
	}
}

/*
 * This backend starts waiting for keys (nkeys of them, on one target;
 * names[i] is the SQL name of keys[i], owners[i] its owner value): publish
 * it.  The callbacks that
 * clear it come first, so that no error leaves it published.  No-op
 * without preloading.
 */
void
rl_waiters_begin(const RLWaitKey *keys, const char *const *names,
				 const char *const *owners, int nkeys)
{
	RLWaiterSlot *slot = slot_of_mine();
	RLWaiterSlot *w;

	rl_waiters_end();
	if (slot == NULL || nkeys <= 0)
		return;
	rl_wait_end_with(rl_waiters_end);
	w = palloc(sizeof(RLWaiterSlot));
	fill_record(w, keys, names, owners, nkeys);

	START_CRIT_SECTION();
	slot->changecount++;
	pg_write_barrier();
	slot->pid = w->pid;
	slot->since = w->since;
	slot->nkeys = w->nkeys;
	memcpy(slot->keys, w->keys, sizeof(w->keys));
	memcpy(slot->text, w->text, sizeof(w->text));
	pg_write_barrier();
	slot->changecount++;
	END_CRIT_SECTION();
	my_slot = slot;
	pfree(w);
}

/* This backend stopped waiting (any way); never raises, idempotent */
void
rl_waiters_end(void)
{
	RLWaiterSlot *slot = my_slot;

	if (slot == NULL)
		return;
	my_slot = NULL;
	START_CRIT_SECTION();
	slot->changecount++;
	pg_write_barrier();
	slot->pid = 0;
	slot->nkeys = 0;
	pg_write_barrier();
	slot->changecount++;
	END_CRIT_SECTION();
}

/* ----------------------------------------------------------------
 * Reading every record
 * ----------------------------------------------------------------
 */

/* A consistent copy of slot in copy: retried while its backend writes it */
static void
copy_slot(volatile RLWaiterSlot *slot, RLWaiterSlot *copy)
{
	for (;;)
	{
		uint32		before = slot->changecount;
		uint32		after;

		pg_read_barrier();
		memcpy(copy, (const RLWaiterSlot *) slot, sizeof(RLWaiterSlot));
		pg_read_barrier();
		after = slot->changecount;
		if (before == after && (before & 1) == 0)
			return;
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Every key every backend of this server waits for now, one RLWaiter each
 * (allocated in the current memory context), in the records' order;
 * returns how many.  None without preloading.
 */
int
rl_waiters_snapshot(RLWaiter **out)
{
	RLWaiterSlot *copy;
	int			cap = 16;
	int			n = 0;
	int			i;

	*out = palloc(sizeof(RLWaiter) * cap);
	if (waiters == NULL)
		return 0;
	copy = palloc(sizeof(RLWaiterSlot));
	for (i = 0; i < waiters->nslots; i++)
	{
		int			k;

		if (waiters->slots[i].pid == 0)
			continue;
		copy_slot(&waiters->slots[i], copy);
		if (copy->pid == 0)
			continue;
		for (k = 0; k < copy->nkeys; k++)
		{
			RLWaiter   *r;

			if (n == cap)
			{
				cap *= 2;
				*out = repalloc(*out, sizeof(RLWaiter) * cap);
			}
			r = &(*out)[n++];
			r->pid = copy->pid;
			r->since = copy->since;
			r->target_spec = pstrdup(copy->text);
			r->name = pstrdup(copy->text + copy->keys[k].name_off);
			r->key = pstrdup(copy->text + copy->keys[k].key_off);
			r->owner = pstrdup(copy->text + copy->keys[k].owner_off);
			r->protocol = copy->keys[k].protocol;
		}
	}
	pfree(copy);
	return n;
}
