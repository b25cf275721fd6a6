/*-------------------------------------------------------------------------
 *
 * stream.c
 *	  Owns the bytes between this process and one Redis server: the socket
 *	  (non-blocking TCP connect, abortive close), TLS over it (its
 *	  handshake, reads and writes; tls.c builds the context and starts the
 *	  session), the queue of formatted commands not yet written,
 *	  and the hiredis reply reader the received bytes are fed to, with the
 *	  values and bytes of one reply bounded.  hiredis is used only as a
 *	  RESP codec, for its reader: commands are formatted here.
 *
 *	  Nothing here waits: every call does what the socket allows now and
 *	  says which socket events would let it go on (rl_stream_events); the
 *	  caller waits on the latch.  Nothing here raises for a failure of the
 *	  server or the network: failures are returned with their reason
 *	  (OpenSSL's own text for TLS).  OpenSSL and hiredis objects are malloc'd
 *	  and live exactly as long as the stream, which only rl_stream_close
 *	  frees.
 *
 *	  Must not: know about commands, replies, locks or topologies.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/stream.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "net/net_int.h"

/*
 * The most one reply may hold.  hiredis keeps a reply whole until its last
 * byte is in, in malloc'd memory PostgreSQL neither counts nor frees on
 * ERROR: without bounds a broken, spoofed or hostile server could make a
 * backend or the watchdog worker buffer a 1 GB bulk string, or build ten
 * million empty arrays from 40 MB of "*0" (each a 48-byte redisReply and a
 * pointer in its parent), until command_timeout.
 *
 * No reply to what redis_lock sends comes near either bound but two:
 * CLUSTER SLOTS of a large Cluster whose slots are scattered (8192
 * one-slot ranges, each a master and three replicas with their ids and
 * host names: about 254 000 values and 4.5 MB; a range is 3 values and a
 * node at most 7; a Cluster reaches that many ranges only when its slots
 * were moved one by one), and the grant of redis_lock_acquire_many, one fencing token
 * per name, up to redis_lock.max_locks names (also the most names any other
 * multi-name reply carries).  So a reply may hold
 * RL_REPLY_MAX_VALUES + max_locks values (each array's elements, nested or
 * not, and the reply itself) and RL_REPLY_MAX_BYTES + 32 bytes per lock of
 * max_locks (":<int64>\r\n" is at most 23) on the wire.  A reply past
 * either fails as too large (RL_STREAM_FAIL_TOO_LARGE), its connection is
 * closed.  doc/reference.md ("Limits on Redis replies") states them.
 *
 * A reply being read then costs at most about its values times 72 bytes
 * (a redisReply and its parent's pointer to it) and its strings, plus the
 * bytes received and not parsed yet: a reply made to stay just under both
 * limits peaks at about 75 MB at the default max_locks, its palloc'd copy
 * included (t/test_security.py measures the rest: the bulk string
 * that never ends, or the wide arrays, of an attack are cut off at about
 * 18 MB).
 */
#define RL_REPLY_MAX_VALUES			(1 << 18)
#define RL_REPLY_MAX_BYTES			(16 * 1024 * 1024)
#define RL_REPLY_VALUES_PER_LOCK	1
#define RL_REPLY_BYTES_PER_LOCK		32

/* Bytes of command buffer a connection keeps between round trips */
#define RL_STREAM_OUT_KEEP	(64 * 1024)

struct RLStream
{
	pgsocket	sock;
	SSL		   *ssl;			/* NULL: plain TCP */
	bool		tcp_connected;
	bool		tls_connected;
	/*
	 * What OpenSSL waits for (WL_SOCKET_*), kept apart for the handshake or
	 * a blocked SSL_write (tls_wants) and a blocked SSL_read
	 * (tls_read_wants): a read that blocks must not wipe out what a pending
	 * write waits for.
	 */
	uint32		tls_wants;
	uint32		tls_read_wants;
	bool		tls_got_data;	/* SSL_read has returned data since connecting */
	char		label[300];		/* host:port, for the WARNING of tls_verify=none */
	RLAddr	   *addrs;			/* addresses to go on with, from next_addr */
	int			naddrs;
	int			next_addr;
	redisReader *reader;
	/* the reply being read: how many values and bytes it has so far */
	size_t		reply_values;	/* its elements announced, and itself */
	size_t		reply_bytes;	/* of it, taken from the buffer */
	bool		too_many_values;	/* the reader refused an array for it */
	bool		mid_reply;		/* bytes came since the last whole reply was
								 * taken out, and not all became replies */
	char	   *out;			/* formatted commands not yet written */
	size_t		outlen;
	size_t		outsent;
	size_t		outcap;
};

/* ----------------------------------------------------------------
 * The reply reader: hiredis' own, with the values of a reply bounded
 * ----------------------------------------------------------------
 */
static redisReplyObjectFunctions bounded_functions;

/* hiredis 1.0 made an array's length a size_t */
#if HIREDIS_MAJOR >= 1
typedef size_t rl_array_len;
#else
typedef int rl_array_len;
#endif
static void *(*hiredis_create_array) (const redisReadTask *task, rl_array_len elements) = NULL;

/* The most values one reply may hold (see RL_REPLY_MAX_VALUES) */
static size_t
reply_value_limit(void)
{
	return RL_REPLY_MAX_VALUES + (size_t) rl_max_locks * RL_REPLY_VALUES_PER_LOCK;
}

/* The most bytes one reply may take on the wire */
static size_t
reply_byte_limit(void)
{
	return RL_REPLY_MAX_BYTES + (size_t) rl_max_locks * RL_REPLY_BYTES_PER_LOCK;
}

/*
 * An array of the reply being read: its elements count as values from its
 * header on, before hiredis allocates their pointers, so no header
 * ("*1000000000") and no nesting of arrays makes more than the limit.
 * Other values need no count: each is an element of an array counted here,
 * or the reply itself.  hiredis reports a NULL as out of memory; the flag
 * says it was this.
 */
static void *
bounded_create_array(const redisReadTask *task, rl_array_len elements)
{
	RLStream   *s = (RLStream *) task->privdata;
	size_t		values = task->parent == NULL ? 1 : s->reply_values;

	Assert(values <= reply_value_limit());
	if ((size_t) elements > reply_value_limit() - values)
	{
		s->too_many_values = true;
		return NULL;
	}
	s->reply_values = values + (size_t) elements;
	return hiredis_create_array(task, elements);
}

/* hiredis' reader, its arrays counted for s (which its tasks carry) */
static redisReader *
reader_create(RLStream *s)
{
	redisReader *r = redisReaderCreate();

	if (r == NULL)
		return NULL;
	if (hiredis_create_array == NULL)
	{
		bounded_functions = *r->fn;
		hiredis_create_array = bounded_functions.createArray;
		bounded_functions.createArray = bounded_create_array;
	}
	r->fn = &bounded_functions;
	r->privdata = s;
	return r;
}

/* Bytes received and not yet taken as replies */
static bool
reader_has_bytes(const redisReader *r)
{
	return r->pos < r->len;
}

/* ----------------------------------------------------------------
 * Opening and closing
 * ----------------------------------------------------------------
 */

/* A non-blocking socket connecting to a, or PGINVALID_SOCKET (errno set) */
static pgsocket
start_tcp(const RLAddr *a)
{
	pgsocket	sock = socket(a->family, SOCK_STREAM, 0);
	int			one = 1;

	if (sock == PGINVALID_SOCKET)
		return sock;
	if (!pg_set_noblock(sock) ||
		setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
		(connect(sock, (const struct sockaddr *) &a->sa, a->len) != 0 && errno != EINPROGRESS))
	{
		int			save = errno;

		closesocket(sock);
		errno = save;
		return PGINVALID_SOCKET;
	}
	return sock;
}

static RLStream *stream_around(pgsocket sock, const RLEndpoint *ep,
							   const RLAddr *rest, int nrest,
							   RLStreamFailure *failure, char **reason);

/*
 * Start a non-blocking connect to ep at the addresses its name resolved to
 * (rl_resolve_all): IPv4 addresses first, then IPv6 (as hiredis did), the
 * first that can start; the others are kept for rl_stream_next_address.
 * Returns NULL with *failure and *reason set when it cannot even start.
 */
RLStream *
rl_stream_open(const RLEndpoint *ep, const RLResolution *resolved,
			   RLStreamFailure *failure, char **reason)
{
	const RLAddr *addrs = resolved->addrs;
	char	   *why = resolved->why;
	int			n = resolved->naddrs;
	int			i;
	pgsocket	sock = PGINVALID_SOCKET;

	if (n == 0)
	{
		*failure = RL_STREAM_FAIL_CONNECT;
		*reason = why != NULL ? pstrdup(why) : pstrdup("no address");
		return NULL;
	}
	if (!AcquireExternalFD())
	{
		*failure = RL_STREAM_FAIL_LOCAL;
		*reason = pstrdup("there are too many open files on the local server");
		return NULL;
	}
	for (i = 0; i < n && sock == PGINVALID_SOCKET; i++)
	{
		sock = start_tcp(&addrs[i]);
		if (sock == PGINVALID_SOCKET)
			why = pstrdup(strerror(errno));
	}
	if (sock == PGINVALID_SOCKET)
	{
		ReleaseExternalFD();
		*failure = RL_STREAM_FAIL_CONNECT;
		*reason = why;
		return NULL;
	}
	return stream_around(sock, ep, addrs + i, n - i, failure, reason);
}

/*
 * The connect to the current address timed out (TCP not up yet): go on with
 * the next address that can start, keeping what is queued to write.
 * Returns false when none is left.  The old socket is closed, so the
 * caller's wait sets must be made anew.
 */
bool
rl_stream_next_address(RLStream *s)
{
	struct linger abort_close = {1, 0};

	Assert(!s->tcp_connected);
	while (s->next_addr < s->naddrs)
	{
		pgsocket	sock = start_tcp(&s->addrs[s->next_addr++]);

		if (sock == PGINVALID_SOCKET)
			continue;
		(void) setsockopt(s->sock, SOL_SOCKET, SO_LINGER, &abort_close, sizeof(abort_close));
		closesocket(s->sock);
		s->sock = sock;
		if (s->ssl != NULL)
			(void) SSL_set_fd(s->ssl, sock);
		return true;
	}
	return false;
}

/* How many more addresses rl_stream_next_address could try */
int
rl_stream_addresses_left(const RLStream *s)
{
	return s->naddrs - s->next_addr;
}

#ifdef USE_ASSERT_CHECKING
/*
 * Assert-enabled builds only: RL_TEST_STREAM_FAULT=1 in the server's
 * environment makes every stream set-up raise "out of memory" once the
 * socket, the reply reader and (TLS) the SSL object exist, as an allocation
 * failing there would, so t/test_tls.py can check that nothing of them
 * outlives the ERROR.
 */
static void
inject_setup_fault(void)
{
	const char *fault = getenv("RL_TEST_STREAM_FAULT");

	if (fault != NULL && strcmp(fault, "1") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory"),
				 errdetail_internal("Injected by RL_TEST_STREAM_FAULT.")));
}
#endif

/*
 * The stream of a socket just connecting, with its reply reader and, for
 * TLS, its SSL object.  The socket (and its external-FD count) belongs to
 * the stream from the first line: an ERROR while the rest is made (out of
 * memory, building the TLS context) closes whatever was made, so no socket
 * or SSL object outlives it.  Returns NULL with *failure and *reason set,
 * everything closed, when hiredis or OpenSSL refuse.
 */
static RLStream *
stream_around(pgsocket sock, const RLEndpoint *ep, const RLAddr *rest, int nrest,
			  RLStreamFailure *failure, char **reason)
{
	RLStream   *volatile s = NULL;
	volatile RLStreamFailure why = RL_STREAM_FAIL_LOCAL;
	char	   *volatile why_text = NULL;

	PG_TRY();
	{
		s = MemoryContextAllocZero(TopMemoryContext, sizeof(RLStream));
		s->sock = sock;
		if (nrest > 0)
		{
			s->addrs = MemoryContextAlloc(TopMemoryContext, sizeof(RLAddr) * nrest);
			memcpy(s->addrs, rest, sizeof(RLAddr) * nrest);
			s->naddrs = nrest;
		}
		snprintf(s->label, sizeof(s->label), "%s:%d", ep->host, ep->port);
		s->reader = reader_create(s);
		if (s->reader == NULL)
			why_text = pstrdup("out of memory in hiredis");
		else if (ep->tls)
		{
			why_text = rl_tls_start(&s->ssl, s->sock, ep);
			why = RL_STREAM_FAIL_TLS;
		}
#ifdef USE_ASSERT_CHECKING
		inject_setup_fault();
#endif
	}
	PG_CATCH();
	{
		if (s != NULL)
			rl_stream_close(s);
		else
		{
			closesocket(sock);
			ReleaseExternalFD();
		}
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (why_text != NULL)
	{
		rl_stream_close(s);
		*failure = why;
		*reason = why_text;
		return NULL;
	}
	return s;
}

/*
 * Close abortively (RST, SO_LINGER 0): a graceful close would let the
 * kernel go on retransmitting what we wrote, so a command we gave up on
 * could still reach Redis seconds later.  No TLS close_notify either, for
 * the same reason.
 */
void
rl_stream_close(RLStream *s)
{
	struct linger abort_close = {1, 0};

	if (s->ssl != NULL)
		SSL_free(s->ssl);
	if (s->reader != NULL)
		redisReaderFree(s->reader);
	(void) setsockopt(s->sock, SOL_SOCKET, SO_LINGER, &abort_close, sizeof(abort_close));
	closesocket(s->sock);
	ReleaseExternalFD();
	if (s->out != NULL)
		pfree(s->out);
	if (s->addrs != NULL)
		pfree(s->addrs);
	pfree(s);
}

/* The stream's socket, for the caller's latch wait */
pgsocket
rl_stream_socket(const RLStream *s)
{
	return s->sock;
}

/* Does the stream run TLS (then any socket event may let it read)? */
bool
rl_stream_is_tls(const RLStream *s)
{
	return s->ssl != NULL;
}

/* TCP is up and the TLS handshake is not done yet */
bool
rl_stream_in_handshake(const RLStream *s)
{
	return s->tcp_connected && s->ssl != NULL && !s->tls_connected;
}

/*
 * What OpenSSL needs from the socket to go on after SSL_do_handshake or
 * SSL_write (into s->tls_wants)
 */
static RLStreamStatus
tls_would_block(RLStream *s, int ret)
{
	switch (SSL_get_error(s->ssl, ret))
	{
		case SSL_ERROR_WANT_READ:
			s->tls_wants = WL_SOCKET_READABLE;
			return RL_STREAM_WAIT;
		case SSL_ERROR_WANT_WRITE:
			s->tls_wants = WL_SOCKET_WRITEABLE;
			return RL_STREAM_WAIT;
		default:
			return RL_STREAM_FAILED;
	}
}

/*
 * Go on connecting: finish TCP, then the TLS handshake.  DONE once the
 * stream can carry commands.
 */
RLStreamStatus
rl_stream_connect(RLStream *s, RLStreamFailure *failure, char **reason)
{
	if (!s->tcp_connected)
	{
		int			err = 0;
		socklen_t	len = sizeof(err);
		struct sockaddr_storage peer;
		socklen_t	plen = sizeof(peer);

		if (getsockopt(s->sock, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err == 0 && getpeername(s->sock, (struct sockaddr *) &peer, &plen) != 0)
			err = errno;
		if (err == EINPROGRESS)
			return RL_STREAM_WAIT;
		if (err != 0)
		{
			*failure = RL_STREAM_FAIL_CONNECT;
			*reason = pstrdup(strerror(err));
			return RL_STREAM_FAILED;
		}
		s->tcp_connected = true;
	}
	if (s->ssl != NULL && !s->tls_connected)
	{
		int			ret;

		ERR_clear_error();
		errno = 0;
		ret = SSL_do_handshake(s->ssl);
		if (ret != 1)
		{
			if (tls_would_block(s, ret) == RL_STREAM_WAIT)
				return RL_STREAM_WAIT;
			*failure = RL_STREAM_FAIL_TLS;
			*reason = rl_tls_reason(s->ssl, "TLS handshake failed");
			return RL_STREAM_FAILED;
		}
		s->tls_connected = true;
		s->tls_wants = 0;
		if (rl_tls_verify == RL_TLS_VERIFY_NONE)
			ereport(WARNING,
					(errmsg("TLS connection to Redis at %s is not verified", s->label),
					 errdetail("redis_lock.tls_verify is none: the server's certificate is not checked.")));
	}
	return RL_STREAM_DONE;
}

/* The socket events that would let the stream make progress */
uint32
rl_stream_events(const RLStream *s)
{
	if (!s->tcp_connected)
		return WL_SOCKET_CONNECTED;
	if (s->ssl != NULL && !s->tls_connected)
		return s->tls_wants ? s->tls_wants : WL_SOCKET_READABLE;

	/*
	 * Unsent bytes need a writable socket, unless SSL_write is blocked on
	 * reading: then readable is all that helps it, and asking for writable
	 * too (a socket that is nearly always writable) would wake the wait at
	 * once, again and again, until data or the deadline came.
	 */
	if ((rl_stream_has_unsent(s) && s->tls_wants != WL_SOCKET_READABLE) ||
		s->tls_read_wants == WL_SOCKET_WRITEABLE)
		return WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE;
	return WL_SOCKET_READABLE;
}

/* ----------------------------------------------------------------
 * Writing
 * ----------------------------------------------------------------
 */
/* Decimal digits of n, written at p; returns how many */
static int
put_decimal(char *p, size_t n)
{
	char		tmp[20];
	int			len = 0;
	int			i;

	do
	{
		tmp[len++] = '0' + n % 10;
		n /= 10;
	} while (n > 0);
	for (i = 0; i < len; i++)
		p[i] = tmp[len - 1 - i];
	return len;
}

/*
 * Format one command (RESP: "*argc", then "$len" and the bytes of each
 * argument) and queue it behind what is not yet written; nothing is sent
 * until rl_stream_write.  Written straight into the queue: hiredis'
 * redisFormatCommandArgv costs a malloc, a copy and an sprintf per
 * argument, several thousand instructions per command.  Raises only when
 * out of memory.
 */
void
rl_stream_append(RLStream *s, int argc, const char **argv, const size_t *argvlen)
{
	size_t		len = 1 + 20 + 2;	/* "*<argc>\r\n" at most */
	char	   *p;
	int			i;

	for (i = 0; i < argc; i++)
		len += 1 + 20 + 2 + argvlen[i] + 2;
	if (s->outsent == s->outlen)
		s->outsent = s->outlen = 0;
	if (s->outlen + len > s->outcap)
	{
		s->outcap = Max(s->outcap * 2, s->outlen + len + 256);
		s->out = s->out == NULL ?
			MemoryContextAlloc(TopMemoryContext, s->outcap) :
			repalloc(s->out, s->outcap);
	}
	p = s->out + s->outlen;
	*p++ = '*';
	p += put_decimal(p, (size_t) argc);
	*p++ = '\r';
	*p++ = '\n';
	for (i = 0; i < argc; i++)
	{
		*p++ = '$';
		p += put_decimal(p, argvlen[i]);
		*p++ = '\r';
		*p++ = '\n';
		memcpy(p, argv[i], argvlen[i]);
		p += argvlen[i];
		*p++ = '\r';
		*p++ = '\n';
	}
	s->outlen = p - s->out;
}

/* Are queued command bytes still waiting to be written? */
bool
rl_stream_has_unsent(const RLStream *s)
{
	return s->outsent < s->outlen;
}

/*
 * Write what the socket takes now.  *progress: some bytes went out.  DONE
 * when nothing is left to write.
 */
RLStreamStatus
rl_stream_write(RLStream *s, bool *progress, RLStreamFailure *failure, char **reason)
{
	*progress = false;
	while (s->outsent < s->outlen)
	{
		size_t		n = s->outlen - s->outsent;
		ssize_t		w;

		if (s->ssl != NULL)
		{
			uint64		before = BIO_number_written(SSL_get_wbio(s->ssl));

			ERR_clear_error();
			errno = 0;
			w = SSL_write(s->ssl, s->out + s->outsent, (int) Min(n, (size_t) INT_MAX));
			/* a record can go out even when the call then blocks */
			if (BIO_number_written(SSL_get_wbio(s->ssl)) != before)
				*progress = true;
			if (w <= 0)
			{
				if (tls_would_block(s, (int) w) == RL_STREAM_WAIT)
					return RL_STREAM_WAIT;
				*failure = RL_STREAM_FAIL_IO;
				*reason = rl_tls_reason(s->ssl, "TLS write failed");
				return RL_STREAM_FAILED;
			}
			/* the write went on: what it waited for is no longer wanted */
			s->tls_wants = 0;
		}
		else
		{
			w = send(s->sock, s->out + s->outsent, n, MSG_NOSIGNAL);
			if (w < 0)
			{
				if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
					return RL_STREAM_WAIT;
				*failure = RL_STREAM_FAIL_IO;
				*reason = pstrdup(strerror(errno));
				return RL_STREAM_FAILED;
			}
		}
		s->outsent += w;
		*progress = true;
	}

	/*
	 * All written: the buffer of a large pipeline (release_all of 10 000
	 * locks: megabytes) is not kept for the connection's life.
	 */
	if (s->outcap > RL_STREAM_OUT_KEEP)
	{
		pfree(s->out);
		s->out = NULL;
		s->outcap = s->outlen = s->outsent = 0;
	}
	return RL_STREAM_DONE;
}

/* ----------------------------------------------------------------
 * Reading
 * ----------------------------------------------------------------
 */

/*
 * Read everything available now (with TLS: until OpenSSL has no decrypted
 * bytes left, which the socket alone would not show) into the reader.
 */
RLStreamStatus
rl_stream_read(RLStream *s, RLStreamFailure *failure, char **reason)
{
	char		buf[16384];
	int			rounds;

	/*
	 * At most 256 kB a call, so that a fast sender cannot hold off the
	 * deadlines; but never leave decrypted bytes inside OpenSSL, where a
	 * socket wait would not see them.
	 */
	for (rounds = 0;; rounds++)
	{
		ssize_t		n;

		if (rounds >= 16 && (s->ssl == NULL || SSL_pending(s->ssl) == 0))
			return RL_STREAM_DONE;

		if (s->ssl != NULL)
		{
			uint64		before = BIO_number_read(SSL_get_rbio(s->ssl));

			ERR_clear_error();
			errno = 0;
			n = SSL_read(s->ssl, buf, sizeof(buf));

			/*
			 * An SSL_write blocked on reading may have been waiting for the
			 * bytes this call took from the socket (they can arrive between
			 * the write's try and this read): let it try again.  Apart
			 * from this, only the write's own progress clears its want.
			 */
			if (s->tls_wants == WL_SOCKET_READABLE &&
				BIO_number_read(SSL_get_rbio(s->ssl)) != before)
				s->tls_wants = 0;
			if (n <= 0)
			{
				int			e = SSL_get_error(s->ssl, (int) n);

				if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
				{
					/* the read's own want; a pending write's is kept */
					s->tls_read_wants = e == SSL_ERROR_WANT_WRITE ? WL_SOCKET_WRITEABLE : 0;
					return RL_STREAM_DONE;
				}
				if (e == SSL_ERROR_SSL && !s->tls_got_data && rl_tls_alert_received())
				{
					/*
					 * TLS 1.3: the client's side of the handshake ends
					 * before the server has checked the client's
					 * certificate, so a server that refuses it (missing,
					 * unknown CA, ...) says so with a fatal alert that only
					 * the first read sees.  That is a failed handshake,
					 * with OpenSSL's text of the alert as the reason.
					 */
					*failure = RL_STREAM_FAIL_TLS;
					*reason = rl_tls_reason(s->ssl, "TLS handshake failed");
					return RL_STREAM_FAILED;
				}
				*failure = e == SSL_ERROR_ZERO_RETURN ? RL_STREAM_FAIL_EOF : RL_STREAM_FAIL_IO;
				*reason = e == SSL_ERROR_ZERO_RETURN ?
					pstrdup("server closed the connection") :
					rl_tls_reason(s->ssl, "TLS read failed");
				return RL_STREAM_FAILED;
			}
			/* data: a WANT_WRITE of an earlier read is stale */
			s->tls_read_wants = 0;
			s->tls_got_data = true;
		}
		else
		{
			n = recv(s->sock, buf, sizeof(buf), 0);
			if (n < 0)
			{
				if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
					return RL_STREAM_DONE;
				*failure = RL_STREAM_FAIL_IO;
				*reason = pstrdup(strerror(errno));
				return RL_STREAM_FAILED;
			}
			if (n == 0)
			{
				*failure = RL_STREAM_FAIL_EOF;
				*reason = pstrdup("server closed the connection");
				return RL_STREAM_FAILED;
			}
		}
		s->mid_reply = true;
		if (redisReaderFeed(s->reader, buf, (size_t) n) != REDIS_OK)
		{
			*failure = RL_STREAM_FAIL_LOCAL;
			*reason = pstrdup("out of memory in hiredis");
			return RL_STREAM_FAILED;
		}
		if ((size_t) n < sizeof(buf) && (s->ssl == NULL || SSL_pending(s->ssl) == 0))
			return RL_STREAM_DONE;
	}
}

/* Bytes in the reader's buffer not parsed yet */
static size_t
reader_unparsed(const redisReader *r)
{
	return r->len - r->pos;
}

/*
 * The next complete reply from the bytes read so far (a hiredis reply the
 * caller frees), or *reply NULL when none is complete.  False, with
 * *failure and *reason set, when the bytes are not RESP or the reply is
 * larger than a reply may be (RL_REPLY_MAX_VALUES, RL_REPLY_MAX_BYTES):
 * then the stream is out of step for good, the caller closes it.
 *
 * A reply's size is checked here, each time the bytes read so far are
 * parsed, which the callers do after every rl_stream_read (at most 256 kB):
 * a reply not yet whole counts what hiredis made of it and what waits in
 * its buffer, so neither a bulk string that never ends nor arrays that
 * never end grow past the limits by more than one read.
 */
bool
rl_stream_next_reply(RLStream *s, void **reply, RLStreamFailure *failure,
					 char **reason)
{
	redisReader *r = s->reader;
	size_t		before;
	size_t		bytes;

	*reply = NULL;
	/* no reply begun: this call starts the next one */
	if (r->ridx < 0)
		s->reply_bytes = 0;
	s->too_many_values = false;
	before = reader_unparsed(r);
	if (redisReaderGetReply(r, reply) != REDIS_OK)
	{
		if (s->too_many_values)
		{
			*failure = RL_STREAM_FAIL_TOO_LARGE;
			*reason = psprintf("the reply has more than %zu values", reply_value_limit());
		}
		else
		{
			*failure = RL_STREAM_FAIL_PARSE;
			*reason = pstrdup(r->errstr[0] ? r->errstr : "protocol error");
		}
		return false;
	}
	/* hiredis moves its buffer, but what it took is what is gone from it */
	s->reply_bytes += before - reader_unparsed(r);
	bytes = s->reply_bytes + (*reply == NULL ? reader_unparsed(r) : 0);
	if (bytes > reply_byte_limit())
	{
		if (*reply != NULL)
			r->fn->freeObject(*reply);
		*reply = NULL;
		*failure = RL_STREAM_FAIL_TOO_LARGE;
		*reason = psprintf("the reply is longer than %zu bytes", reply_byte_limit());
		return false;
	}
	/* a whole reply with nothing after it: no reply begun */
	if (*reply != NULL && !reader_has_bytes(r))
		s->mid_reply = false;
	return true;
}

/*
 * Does the reply reader hold bytes that are not yet a whole reply (the
 * start of one whose rest is still to come)?  Call after taking out every
 * complete reply.
 */
bool
rl_stream_has_partial_reply(const RLStream *s)
{
	/*
	 * Bytes not parsed yet, or some parsed into a reply not whole yet (an
	 * array's first elements: hiredis keeps them, its buffer is empty)
	 */
	return reader_has_bytes(s->reader) || s->mid_reply;
}

/*
 * Has an idle stream bytes (or an EOF) nobody asked for?  With TLS the
 * records waiting are read first: a TLS 1.3 session ticket is not data.
 */
bool
rl_stream_has_unasked(RLStream *s)
{
	char		c;
	ssize_t		n;

	if (reader_has_bytes(s->reader))
		return true;
	if (s->ssl != NULL)
	{
		RLStreamFailure failure;
		char	   *reason;

		if (rl_stream_read(s, &failure, &reason) != RL_STREAM_DONE)
			return true;
		return reader_has_bytes(s->reader);
	}
	n = recv(s->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n >= 0)
		return true;			/* data, or the peer closed */
	return errno != EAGAIN && errno != EWOULDBLOCK;
}
