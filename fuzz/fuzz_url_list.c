/*
 * libFuzzer target: the URL-list hooks of redis_lock.nodes / .sentinels
 * (check_nodes / check_sentinels, or check_url_list, src/base/settings.c) on arbitrary comma/space separated text,
 * and parse_list (src/net/topology.c), which trusts that the hook accepted the
 * list.  A list the hook accepts must parse into exactly the endpoints
 * rl_parse_url gives for each element, and a list of Redlock masters no
 * more than RL_MAX_NODES of them (callers size their connection arrays by
 * it); an ERROR from parse_list after the
 * hook accepted is a real disagreement and aborts.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_url_list.c
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

static void
fail(const char *what, const char *list)
{
	fprintf(stderr, "fuzz_url_list: %s for list \"%s\"\n", what, list);
	abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *list = malloc(size + 1);
	char	   *val = list;
	bool		ok;
	bool		ok_nodes;

	memcpy(list, data, size);
	list[size] = '\0';

	/* Redlock masters are capped at RL_MAX_NODES, Sentinels may not be */
	ok_nodes = NODES_HOOK(&val, NULL, PGC_S_SESSION);
	if (val != list)
		fail("the hook replaced the value", list);
	val = list;
	ok = SENTINELS_HOOK(&val, NULL, PGC_S_SESSION) || ok_nodes;
	if (ok && list[0] != '\0')
	{
		RLEndpoint *eps = NULL;
		int			n = 0;
		char	   *copy = strdup(list);
		char	   *save = NULL;
		char	   *tok;
		int			i = 0;

		PG_TRY();
		{
			n = parse_list(list, &eps);
		}
		PG_CATCH();
		{
			fail("parse_list raised on a list the hook accepted", list);
		}
		PG_END_TRY();

		for (tok = strtok_r(copy, ", \t", &save); tok != NULL;
			 tok = strtok_r(NULL, ", \t", &save), i++)
		{
			RLEndpoint	ep;
			char	   *msg;

			if (i >= n)
				fail("parse_list returned too few endpoints", list);
			if (!rl_parse_url(tok, &ep, &msg))
				fail("an element the hook accepted does not parse", list);
			if (strcmp(ep.host, eps[i].host) != 0 || ep.port != eps[i].port ||
				ep.db != eps[i].db || strcmp(ep.user, eps[i].user) != 0)
				fail("parse_list and rl_parse_url disagree", list);
		}
		if (i != n)
			fail("parse_list returned too many endpoints", list);
		/* callers keep a target's connections in RLConn *conns[RL_MAX_NODES] */
		if (ok_nodes && n > RL_MAX_NODES)
			fail("the redis_lock.nodes hook accepted more than RL_MAX_NODES URLs", list);
		free(copy);
	}
	free(list);
	stub_arena_reset();
	return 0;
}
