/*
 * libFuzzer target: rl_stream_append (src/net/stream.c), which formats commands
 * in RESP itself, against hiredis' redisFormatCommandArgv on the same
 * arguments.  The input is a list of arguments, each a length byte and that
 * many bytes (any bytes: RESP arguments are binary-safe); several commands
 * are appended to one stream, so the queue's growth is exercised too.  Any
 * difference from hiredis' bytes aborts.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  fuzz/fuzz_format.c
 */
#include <unistd.h>

#include "../src/net/stream.c"
#include "../src/net/tls.c"

#include <stdio.h>
#include <stdlib.h>

extern void stub_arena_reset(void);

/*
 * what the connection code of stream.c and tls.c refers to; never called by
 * this harness
 */
char	   *rl_tls_ca_file = NULL;
char	   *rl_tls_cert_file = NULL;
char	   *rl_tls_key_file = NULL;
int			rl_tls_verify = 0;
uint64		rl_settings_generation = 0;
bool		AcquireExternalFD(void) { abort(); }
void		ReleaseExternalFD(void) { abort(); }
bool		pg_set_noblock(pgsocket sock) { abort(); }
char	   *pg_strerror(int errnum) { abort(); }

#define MAX_ARGS 64

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	RLStream	s;
	char	   *expected = NULL;
	size_t		explen = 0;
	size_t		pos = 0;

	memset(&s, 0, sizeof(s));
	while (pos < size)
	{
		const char *argv[MAX_ARGS];
		size_t		argvlen[MAX_ARGS];
		int			argc = 0;
		char	   *ref;
		int			n;

		/* one command: arguments until a zero length byte or the end */
		while (pos < size && argc < MAX_ARGS)
		{
			size_t		len = data[pos++];

			if (len == 0)
				break;
			len = Min(len - 1, size - pos);
			argv[argc] = (const char *) data + pos;
			argvlen[argc++] = len;
			pos += len;
		}
		if (argc == 0)
			continue;
		rl_stream_append(&s, argc, argv, argvlen);
		n = redisFormatCommandArgv(&ref, argc, argv, argvlen);
		if (n < 0)
			abort();
		expected = realloc(expected, explen + n);
		memcpy(expected + explen, ref, n);
		explen += n;
		redisFreeCommand(ref);
	}
	if (s.outlen != explen || (explen > 0 && memcmp(s.out, expected, explen) != 0))
	{
		fprintf(stderr, "fuzz_format: %zu bytes formatted, hiredis made %zu\n",
				s.outlen, explen);
		abort();
	}
	free(expected);
	stub_arena_reset();
	return 0;
}
