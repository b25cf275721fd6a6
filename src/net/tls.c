/*-------------------------------------------------------------------------
 *
 * tls.c
 *	  Owns TLS with OpenSSL up to the handshake: the context built from the
 *	  settings (CA, client certificate and key, verification mode, TLS 1.2
 *	  or later) and kept until they change, the session started over a
 *	  connected socket (SNI, the host name or address to verify), and
 *	  OpenSSL's reason for a failure, as text for messages.
 *
 *	  stream.c shakes hands, reads and writes through the session and frees
 *	  it.  Must not: touch a socket but to hand it to OpenSSL, wait, raise
 *	  for a failure (it is returned as text), or know about commands.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/net/tls.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "net/net_int.h"

/* ----------------------------------------------------------------
 * TLS context, built from the settings and kept until they change
 * ----------------------------------------------------------------
 */
static SSL_CTX *tls_ctx = NULL;
static uint64 tls_ctx_generation = 0;

/*
 * OpenSSL's reason for the last failure; for a failed handshake that
 * verified the server, the certificate check's reason first.
 */
char *
rl_tls_reason(SSL *ssl, const char *what)
{
	unsigned long e = ERR_get_error();
	const char *reason = e != 0 ? ERR_reason_error_string(e) : NULL;
	long		verify = X509_V_OK;

	if (ssl != NULL && !SSL_is_init_finished(ssl) && rl_tls_verify != RL_TLS_VERIFY_NONE)
		verify = SSL_get_verify_result(ssl);

	ERR_clear_error();
	if (verify != X509_V_OK)
		return psprintf("%s: certificate verify failed: %s", what,
						X509_verify_cert_error_string(verify));
	if (reason != NULL)
		return psprintf("%s: %s", what, reason);
	if (e != 0)
		return psprintf("%s: OpenSSL error %lu", what, e);
	return psprintf("%s: %s", what, errno != 0 ? strerror(errno) : "connection closed");
}

/* Is OpenSSL's first queued error a fatal alert the server sent us? */
bool
rl_tls_alert_received(void)
{
	unsigned long e = ERR_peek_error();

	/* OpenSSL reports a received alert as reason SSL_AD_REASON_OFFSET + alert */
	return ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET;
}

/* libpq's rule: a private key readable by group or others is refused */
static char *
check_key_file(const char *path)
{
	struct stat st;

	if (stat(path, &st) != 0)
		return psprintf("could not access private key file \"%s\": %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return psprintf("private key file \"%s\" is not a regular file", path);
	/* root-owned keys may be group-readable (/etc/ssl/private, ssl-cert) */
	if (st.st_uid == 0 ? (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO)) :
		(st.st_mode & (S_IRWXG | S_IRWXO)))
		return psprintf("private key file \"%s\" is readable by group or others", path);
	return NULL;
}

static int
no_passphrase(char *buf, int size, int rwflag, void *userdata)
{
	return -1;
}

static SSL_CTX *
tls_context(char **reason)
{
	SSL_CTX    *ctx;

	if (tls_ctx != NULL && tls_ctx_generation == rl_settings_generation)
		return tls_ctx;
	if (tls_ctx != NULL)
		SSL_CTX_free(tls_ctx);
	tls_ctx = NULL;
	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL)
	{
		*reason = rl_tls_reason(NULL, "could not create a TLS context");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
	/* an encrypted key must fail, not prompt on the postmaster's terminal */
	SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
					 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (rl_tls_ca_file != NULL && rl_tls_ca_file[0] != '\0')
	{
		if (SSL_CTX_load_verify_locations(ctx, rl_tls_ca_file, NULL) != 1)
		{
			*reason = rl_tls_reason(NULL, psprintf("could not load CA file \"%s\"", rl_tls_ca_file));
			SSL_CTX_free(ctx);
			return NULL;
		}
	}
	else if (SSL_CTX_set_default_verify_paths(ctx) != 1)
	{
		*reason = rl_tls_reason(NULL, "could not load the system's trusted CAs");
		SSL_CTX_free(ctx);
		return NULL;
	}
	if (rl_tls_cert_file != NULL && rl_tls_cert_file[0] != '\0')
	{
		const char *key = rl_tls_key_file != NULL && rl_tls_key_file[0] != '\0' ?
			rl_tls_key_file : rl_tls_cert_file;

		*reason = check_key_file(key);
		if (*reason != NULL)
		{
			SSL_CTX_free(ctx);
			return NULL;
		}
		if (SSL_CTX_use_certificate_chain_file(ctx, rl_tls_cert_file) != 1)
		{
			*reason = rl_tls_reason(NULL, psprintf("could not load client certificate \"%s\"",
												rl_tls_cert_file));
			SSL_CTX_free(ctx);
			return NULL;
		}
		if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
			SSL_CTX_check_private_key(ctx) != 1)
		{
			*reason = rl_tls_reason(NULL, psprintf("could not load private key \"%s\"", key));
			SSL_CTX_free(ctx);
			return NULL;
		}
	}
	SSL_CTX_set_verify(ctx, rl_tls_verify == RL_TLS_VERIFY_NONE ?
					   SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
	tls_ctx = ctx;
	tls_ctx_generation = rl_settings_generation;
	return ctx;
}

static bool
is_ip_literal(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/*
 * A TLS session over the connected socket sock, not yet shaken hands, into
 * *ssl (which the caller frees, also when this fails).  Returns NULL, or
 * why it could not start.
 */
char *
rl_tls_start(SSL **ssl, pgsocket sock, const RLEndpoint *ep)
{
	char	   *reason = NULL;
	SSL_CTX    *ctx = tls_context(&reason);
	X509_VERIFY_PARAM *param;

	if (ctx == NULL)
		return reason;
	*ssl = SSL_new(ctx);
	if (*ssl == NULL || SSL_set_fd(*ssl, sock) != 1)
		return rl_tls_reason(NULL, "could not start TLS");
	SSL_set_connect_state(*ssl);
	param = SSL_get0_param(*ssl);
	if (!is_ip_literal(ep->host))
		SSL_set_tlsext_host_name(*ssl, ep->host);
	if (rl_tls_verify == RL_TLS_VERIFY_FULL)
	{
		X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (is_ip_literal(ep->host) ?
			X509_VERIFY_PARAM_set1_ip_asc(param, ep->host) != 1 :
			X509_VERIFY_PARAM_set1_host(param, ep->host, 0) != 1)
			return rl_tls_reason(NULL, "could not set the host name to verify");
	}
	return NULL;
}
