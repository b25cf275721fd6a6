/*
 * libFuzzer target: from settings the check hooks accept to the target the
 * backend builds (rl_current_target / rl_target_from_spec, src/net/topology.c).
 *
 * Input: one byte choosing the topology (single, cluster, Redlock, Sentinel),
 * then redis_lock.url, redis_lock.nodes or .sentinels, and
 * redis_lock.sentinel_master, separated by newlines.  Inputs whose settings a
 * check hook refuses are skipped: PostgreSQL would never let them through.
 *
 * Memory errors always abort.  With FUZZ_STRICT=1 in the environment the
 * harness also aborts when accepted settings do not give a usable target:
 * rl_current_target raising, or a non-empty list giving no endpoint.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_target_spec.c
 */
#include "../src/base/settings.c"
#include "../src/base/url.c"
#include "../src/net/topology.c"

/* the hooks of redis_lock.nodes and redis_lock.sentinels */
#ifdef HAVE_CHECK_NODES
#define NODES_HOOK check_nodes
#define SENTINELS_HOOK check_sentinels
#else
#define NODES_HOOK check_url_list
#define SENTINELS_HOOK check_url_list
#endif

#include <stdio.h>
#include <stdlib.h>

extern void stub_arena_reset(void);
extern char stub_last_error[];

static int	strict = -1;

static void
finding(const char *what, const char *url, const char *list, const char *master)
{
	fprintf(stderr, "fuzz_target_spec: %s\n  url=\"%s\"\n  list=\"%s\"\n  master=\"%s\"\n",
			what, url, list, master);
	if (strict)
		abort();
}

/* next newline-terminated field of [*p, end), as a fresh C string */
static char *
field(const char **p, const char *end)
{
	const char *nl = memchr(*p, '\n', end - *p);
	const char *stop = nl ? nl : end;
	char	   *s = malloc(stop - *p + 1);

	memcpy(s, *p, stop - *p);
	s[stop - *p] = '\0';
	*p = nl ? nl + 1 : end;
	return s;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = (const char *) data + 1;
	const char *end = (const char *) data + size;
	char	   *url;
	char	   *list;
	char	   *master;
	char	   *v;
	int			kind;

	if (strict < 0)
		strict = getenv("FUZZ_STRICT") != NULL && strcmp(getenv("FUZZ_STRICT"), "1") == 0;
	if (size < 1)
		return 0;
	kind = data[0] % 4;
	url = field(&p, end);
	list = field(&p, end);
	master = field(&p, end);

	/* GUC strings never contain NUL: cut at the first one */
	v = url;
	if (!check_url(&v, NULL, PGC_S_SESSION))
		goto done;
	v = list;
	if ((kind == 2 || kind == 3) &&
		(list[0] == '\0' || !(kind == 2 ? NODES_HOOK : SENTINELS_HOOK) (&v, NULL, PGC_S_SESSION)))
		goto done;

	v = master;
	if (!check_master_name(&v, NULL, PGC_S_SESSION))
		goto done;

	rl_url = url;
	rl_nodes = kind == 2 ? list : "";
	rl_sentinels = kind == 3 ? list : "";
	rl_sentinel_master = master;
	rl_cluster = kind == 1;
	rl_settings_generation++;
	targets = NULL;				/* the arena took the previous ones */
	current = NULL;

	PG_TRY();
	{
		RLTarget   *t = rl_current_target();

		if (t->nendpoints < 1)
			finding("accepted settings give a target with no endpoint", url, list, master);
		if (t->kind == RL_TOPO_SENTINEL &&
			(t->data.port < 1 || t->data.port > 65535 || t->data.host[0] == '\0'))
			finding("sentinel target lost the URL's endpoint", url, list, master);
	}
	PG_CATCH();
	{
		char		buf[1100];

		snprintf(buf, sizeof(buf), "accepted settings make rl_current_target raise: %s",
				 stub_last_error);
		finding(buf, url, list, master);
	}
	PG_END_TRY();

done:
	free(url);
	free(list);
	free(master);
	targets = NULL;
	current = NULL;
	stub_arena_reset();
	return 0;
}
