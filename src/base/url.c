/*-------------------------------------------------------------------------
 *
 * url.c
 *	  Owns the parsing of redis:// and rediss:// URLs into endpoints
 *	  (rl_parse_url), the refusal of a password written into one, and an
 *	  endpoint's label for messages.
 *
 *	  Parses text only: it must not read settings, files or the network.
 *	  The settings' check hooks (settings.c) call it on every URL they
 *	  accept; topology.c trusts what they accepted.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/url.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>
#include <limits.h>

#include "base/base_int.h"

static bool
has_space_or_control(const char *s)
{
	for (; *s; s++)
		if (isspace((unsigned char) *s) || iscntrl((unsigned char) *s))
			return true;
	return false;
}

/* rl_parse_url's detail for a URL that carries a password (compared by address) */
const char *const rl_url_password_msg =
gettext_noop("The settings that hold URLs are readable by every role.");

/* "user@" before the host, if any; returns the error text or NULL */
static const char *
parse_url_user(const char **p, RLEndpoint *ep)
{
	const char *slash = strchr(*p, '/');
	const char *at = strchr(*p, '@');
	size_t		ulen;

	if (at == NULL || (slash != NULL && at > slash))
		return NULL;
	ulen = at - *p;
	if (memchr(*p, ':', ulen) != NULL)
		return rl_url_password_msg;
	if (ulen == 0 || ulen >= sizeof(ep->user))
		return gettext_noop("The user name in the URL is empty or too long.");
	memcpy(ep->user, *p, ulen);
	ep->user[ulen] = '\0';
	*p = at + 1;
	return NULL;
}

/* The host, a name or a bracketed IPv6 address */
static const char *
parse_url_host(const char **p, RLEndpoint *ep)
{
	const char *host = *p;
	const char *hostend;
	size_t		hostlen;

	if (*host == '[')
	{
		const char *close = strchr(host, ']');

		if (close == NULL)
			return gettext_noop("An IPv6 address in the URL lacks its closing \"]\".");
		host++;
		hostlen = close - host;
		hostend = close + 1;
	}
	else
	{
		hostend = host;
		while (*hostend && *hostend != ':' && *hostend != '/')
			hostend++;
		hostlen = hostend - host;
	}
	if (hostlen == 0 || hostlen >= sizeof(ep->host))
		return gettext_noop("The host name in the URL is empty or too long.");
	memcpy(ep->host, host, hostlen);
	ep->host[hostlen] = '\0';
	*p = hostend;
	return NULL;
}

/* ":port" and "/db", both optional, and nothing after them */
static const char *
parse_url_port_db(const char *p, RLEndpoint *ep)
{
	char	   *end;

	if (*p == ':')
	{
		long		port;

		errno = 0;
		port = isdigit((unsigned char) p[1]) ? strtol(p + 1, &end, 10) : 0;
		if (port == 0)
			end = (char *) p + 1;
		if (end == p + 1 || errno != 0 || port < 1 || port > 65535 ||
			(*end != '\0' && *end != '/'))
			return gettext_noop("The port in the URL must be a number between 1 and 65535.");
		ep->port = (int) port;
		p = end;
	}
	if (*p == '/')
	{
		long		db;

		p++;
		if (*p == '\0')
			return NULL;
		errno = 0;
		db = isdigit((unsigned char) *p) ? strtol(p, &end, 10) : -1;
		if (db < 0)
			end = (char *) p;
		if (end == p || *end != '\0' || errno != 0 || db < 0 || db > INT_MAX)
			return gettext_noop("The database in the URL must be a non-negative number.");
		ep->db = (int) db;
		return NULL;
	}
	if (*p != '\0')
		return gettext_noop("The URL has trailing characters after the host.");
	return NULL;
}

/*
 * Parse redis://[user@]host[:port][/db] into *ep.  IPv6 hosts go in
 * brackets.  A password in the URL is refused: the URL is readable by every
 * role, the password belongs in redis_lock.password_file or
 * redis_lock.password, which are not.  On
 * failure returns false with *errmsg set to a detail (marked for
 * translation, not translated: callers apply _()).
 */
bool
rl_parse_url(const char *url, RLEndpoint *ep, char **errmsg)
{
	const char *p;
	const char *err;

	memset(ep, 0, sizeof(*ep));
	ep->port = 6379;
	ep->db = 0;

	if (url == NULL || *url == '\0')
		err = gettext_noop("The URL is empty.");
	else if (strpbrk(url, ",|") != NULL || has_space_or_control(url))
		/* lists split on these, and target specs on "|" (topology.c) */
		err = gettext_noop("A URL must not contain spaces, control characters, \",\" or \"|\".");
	else if (strncmp(url, "redis://", 8) != 0 && strncmp(url, "rediss://", 9) != 0)
		err = gettext_noop("The URL must start with \"redis://\" or \"rediss://\".");
	else
	{
		ep->tls = url[5] == 's';
		p = url + (ep->tls ? 9 : 8);
		err = parse_url_user(&p, ep);
		if (err == NULL)
			err = parse_url_host(&p, ep);
		if (err == NULL)
			err = parse_url_port_db(p, ep);
	}
	*errmsg = (char *) err;
	return err == NULL;
}

/* "host:port" (with /db when not 0) for messages; palloc'd */
char *
rl_endpoint_label(const RLEndpoint *ep)
{
	bool		v6 = strchr(ep->host, ':') != NULL;

	if (ep->db != 0)
		return psprintf(v6 ? "[%s]:%d/%d" : "%s:%d/%d", ep->host, ep->port, ep->db);
	return psprintf(v6 ? "[%s]:%d" : "%s:%d", ep->host, ep->port);
}
