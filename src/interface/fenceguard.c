/*-------------------------------------------------------------------------
 *
 * fenceguard.c
 *	  Owns redis_lock_fence_guard(), the row trigger that rejects writes
 *	  carrying a stale fencing token (doc/leases.md, "Fencing").
 *
 *	  The trigger runs with the rights of whoever writes the row: it reads
 *	  the token column itself, so a type's output function or a cast the
 *	  writer defined runs as the writer.  Only the plain values it found
 *	  (the table's OID, the lock name, the token) reach the one function
 *	  with the extension owner's rights, redis_lock_fence_advance(), which is
 *	  not executable by PUBLIC and is called here directly: the executor has
 *	  already checked that the writer may write this table, the check the
 *	  mark's owner relies on.
 *
 *	  Must not: run anything of the writer's with other rights than the
 *	  writer's, talk to Redis, or touch the lock table (it calls no other
 *	  layer of redis_lock).
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/interface/fenceguard.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"


PG_FUNCTION_INFO_V1(redis_lock_fence_guard);

/*
 * The OID of redis_lock_fence_advance(regclass, text, bigint) in the schema
 * of the trigger function itself (the extension's, which is not
 * relocatable), looked up by its qualified name so that nothing on the
 * writer's search_path can stand in for it.
 */
static Oid
fence_advance_oid(Oid guard)
{
	char	   *schema = get_namespace_name(get_func_namespace(guard));
	Oid			argtypes[3] = {REGCLASSOID, TEXTOID, INT8OID};
	List	   *name;

	if (schema == NULL)
		elog(ERROR, "schema of extension redis_lock not found");
	name = list_make2(makeString(schema), makeString("redis_lock_fence_advance"));
	return LookupFuncName(name, 3, argtypes, false);
}

/*
 * The token the row carries in column col, as the writer: an integer column
 * is read as it is; any other type goes through its output function and
 * bigint's input, which is what the trigger has always accepted.
 */
static int64
row_token(Relation rel, HeapTuple row, const char *col, const char *lock_name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			attnum = SPI_fnumber(desc, col);
	Oid			type;
	Datum		value;
	bool		isnull;

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("table %s.%s has no column \"%s\" for the fencing token",
						get_namespace_name(RelationGetNamespace(rel)),
						RelationGetRelationName(rel), col)));
	value = heap_getattr(row, attnum, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("write to %s.%s carries no fencing token in column \"%s\"",
						get_namespace_name(RelationGetNamespace(rel)),
						RelationGetRelationName(rel), col),
				 errhint("Set %s = redis_lock_fence(%s) while holding the lock.",
						 quote_identifier(col), quote_literal_cstr(lock_name))));
	type = getBaseType(TupleDescAttr(desc, attnum - 1)->atttypid);
	switch (type)
	{
		case INT8OID:
			return DatumGetInt64(value);
		case INT4OID:
			return DatumGetInt32(value);
		case INT2OID:
			return DatumGetInt16(value);
		default:
			{
				Oid			outfunc;
				bool		varlena;
				char	   *text;

				getTypeOutputInfo(TupleDescAttr(desc, attnum - 1)->atttypid,
								  &outfunc, &varlena);
				text = OidOutputFunctionCall(outfunc, value);
				return DatumGetInt64(DirectFunctionCall1(int8in,
														 CStringGetDatum(text)));
			}
	}
}

/*
 * BEFORE INSERT OR UPDATE ... FOR EACH ROW EXECUTE FUNCTION
 * redis_lock_fence_guard('lock name'[, 'token column', default 'fence']):
 * advances the mark of this table (of its partition root) to the row's
 * token, or fails with 40001 when a newer token was already accepted.
 */
Datum
redis_lock_fence_guard(PG_FUNCTION_ARGS)
{
	TriggerData *trig = (TriggerData *) fcinfo->context;
	Trigger    *tg;
	HeapTuple	row;
	const char *lock_name;
	const char *col;
	Oid			table;
	int64		token;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("redis_lock_fence_guard() must be called as a trigger")));
	if (!TRIGGER_FIRED_BEFORE(trig->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trig->tg_event) ||
		TRIGGER_FIRED_BY_DELETE(trig->tg_event) ||
		TRIGGER_FIRED_BY_TRUNCATE(trig->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("redis_lock_fence_guard() must be a BEFORE INSERT OR UPDATE trigger FOR EACH ROW")));
	tg = trig->tg_trigger;
	if (tg->tgnargs < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("redis_lock_fence_guard needs the lock name as its first argument")));

	/*
	 * One session writes a temporary table, so there is nothing to fence;
	 * and its marks would outlive it, since dropping it at session end fires
	 * no event trigger to remove them (redis_lock_fence_marks_drop).
	 */
	if (RelationUsesLocalBuffers(trig->tg_relation))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("redis_lock_fence_guard cannot protect temporary table \"%s\"",
						RelationGetRelationName(trig->tg_relation)),
				 errdetail("Only one session writes a temporary table.")));
	lock_name = tg->tgargs[0];
	col = tg->tgnargs > 1 ? tg->tgargs[1] : "fence";
	row = TRIGGER_FIRED_BY_UPDATE(trig->tg_event) ? trig->tg_newtuple : trig->tg_trigtuple;

	token = row_token(trig->tg_relation, row, col, lock_name);

	/* a partitioned table has one mark, whichever partition the row is in */
	table = RelationGetRelid(trig->tg_relation);
	if (get_rel_relispartition(table))
		table = llast_oid(get_partition_ancestors(table));

	/*
	 * A SECURITY DEFINER function called through fmgr runs as its owner; the
	 * EXECUTE privilege PUBLIC lacks is checked only by the executor.
	 */
	OidFunctionCall3(fence_advance_oid(fcinfo->flinfo->fn_oid), ObjectIdGetDatum(table),
					 CStringGetTextDatum(lock_name), Int64GetDatum(token));
	return PointerGetDatum(row);
}
