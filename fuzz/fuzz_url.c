/*
 * libFuzzer target: rl_parse_url (src/base/url.c) on arbitrary bytes, and
 * the redis_lock.url check hook built on it.  Besides the sanitizers, every
 * accepted URL must give a well-formed endpoint; anything else aborts.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_url.c
 */
#include "../src/base/settings.c"
#include "../src/base/url.c"

#include <stdio.h>
#include <stdlib.h>

extern void stub_arena_reset(void);

static void
fail(const char *what, const char *url)
{
	fprintf(stderr, "fuzz_url: %s for URL \"%s\"\n", what, url);
	abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *url = malloc(size + 1);
	RLEndpoint	ep;
	char	   *msg = NULL;
	bool		ok;

	memcpy(url, data, size);
	url[size] = '\0';			/* the GUC machinery hands over a C string */

	/* poison the endpoint so that a field the parser forgets shows up */
	memset(&ep, 0xA5, sizeof(ep));
	ok = rl_parse_url(url, &ep, &msg);
	if (ok)
	{
		size_t		hl = strnlen(ep.host, sizeof(ep.host));
		size_t		ul = strnlen(ep.user, sizeof(ep.user));
		char	   *label;

		if (hl == 0 || hl == sizeof(ep.host))
			fail("host empty or not terminated", url);
		if (ul == sizeof(ep.user))
			fail("user not terminated", url);
		if (ep.port < 1 || ep.port > 65535)
			fail("port out of range", url);
		if (ep.db < 0)
			fail("negative db", url);
		if (ep.sentinel)
			fail("sentinel flag set by the parser", url);
		if (strchr(ep.user, ':') != NULL)
			fail("a password got into the user name", url);
		if (strncmp(url, "redis://", 8) != 0 && strncmp(url, "rediss://", 9) != 0)
			fail("accepted without redis:// or rediss://", url);
		if (ep.tls != (strncmp(url, "rediss://", 9) == 0))
			fail("TLS flag does not match the scheme", url);
		label = rl_endpoint_label(&ep);
		if (strstr(label, ep.host) == NULL)
			fail("label lacks the host", url);
		pfree(label);
	}
	else if (msg == NULL || msg[0] == '\0')
		fail("refused without a message", url);

	/* the check hook must agree with the parser */
	{
		char	   *val = url;

		if (check_url(&val, NULL, PGC_S_SESSION) != ok)
			fail("check_url disagrees with rl_parse_url", url);
	}
	free(url);
	stub_arena_reset();
	return 0;
}
