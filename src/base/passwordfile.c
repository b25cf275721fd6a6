/*-------------------------------------------------------------------------
 *
 * passwordfile.c
 *	  Owns the lookup of a connection's password in the file named by
 *	  redis_lock.password_file (rl_password_file_lookup): its format, and
 *	  which files it refuses or ignores.
 *
 *	  The file is read by whoever connects (transport.c's handshake), once
 *	  per connection; the password found is the caller's to zero.  Must not:
 *	  talk to Redis, or keep the file's text after the lookup.
 *
 * Copyright (c) 2026, redis_lock developers
 *
 * IDENTIFICATION
 *	  src/base/passwordfile.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/fd.h"

#include "base/base.h"

/* ----------------------------------------------------------------
 * The password file (redis_lock.password_file)
 * ----------------------------------------------------------------
 */

/* The largest password file read; a bigger one is ignored */
#define RL_PASSWORD_FILE_MAX	(1024 * 1024)

/*
 * One field of a password file line: from *p up to an unescaped ':' (not
 * included) or end, "\x" read as "x", copied into out, which has room for
 * it.  *wild tells whether the field is an unescaped "*".  A field before
 * the last must end at a ':', and the last must not; else returns false.
 */
static bool
password_file_field(const char **p, const char *end, char *out, bool last,
					bool *wild)
{
	const char *start = *p;
	const char *s = start;

	while (s < end && *s != ':')
	{
		if (*s == '\\' && s + 1 < end)
			s++;
		*out++ = *s++;
	}
	*out = '\0';
	*wild = s - start == 1 && *start == '*';
	if (last ? s < end : s >= end)
		return false;
	*p = last ? s : s + 1;
	return true;
}

/*
 * Does the line from p to end name ep?  Its password goes into pw, which has
 * room for the line (zeroed by the caller).  *malformed: the line is not
 * four fields.
 */
static bool
password_file_line_matches(const char *p, const char *end,
						   const RLEndpoint *ep, char *pw, bool *malformed)
{
	size_t		len = end - p;
	char	   *field = palloc(len + 1);
	char		port[16];
	const char *user = ep->user[0] != '\0' ? ep->user : "default";
	bool		wild;
	bool		match = false;

	snprintf(port, sizeof(port), "%d", ep->port);
	*malformed = true;
	if (!password_file_field(&p, end, field, false, &wild))
		goto out;
	match = wild || pg_strcasecmp(field, ep->host) == 0;
	if (!password_file_field(&p, end, field, false, &wild))
		goto out;
	match = match && (wild || strcmp(field, port) == 0);
	if (!password_file_field(&p, end, field, false, &wild))
		goto out;
	match = match && (wild || strcmp(field, user) == 0);
	if (!password_file_field(&p, end, pw, true, &wild))
		goto out;
	*malformed = false;
out:
	explicit_bzero(field, len + 1);
	pfree(field);
	return match && !*malformed;
}

/*
 * A WARNING that the password file is ignored, why being what is wrong
 * with it, its path included.  The setting is hidden from other roles
 * (GUC_SUPERUSER_ONLY), so the session, whoever it is, gets a fixed
 * message; the path and why go to the server log only (errdetail_log), as
 * PostgreSQL's deadlock report keeps other sessions' queries there.
 * file_errno: the errno of a file access that failed, else 0.  Frees why.
 */
static void
password_file_ignored(int file_errno, char *why)
{
	errno = file_errno;			/* for errcode_for_file_access */
	ereport(WARNING,
			(file_errno != 0 ? errcode_for_file_access() :
			 errcode(ERRCODE_CONFIG_FILE_ERROR),
			 errmsg("ignoring the Redis password file"),
			 errdetail("The server log names the file and what is wrong with it."),
			 errdetail_log("%s", why)));
	pfree(why);
}

/*
 * The text of the password file, palloc'd and NUL-terminated (the caller
 * zeroes and frees it), or NULL with a WARNING when it cannot be read or is
 * ignored: libpq's rules for .pgpass, not a regular file or accessible by
 * group or others.  O_NONBLOCK: opening a FIFO must not hang the backend.
 */
static char *
password_file_read(const char *path, size_t *len)
{
	int			fd;
	struct stat st;
	char	   *buf = NULL;
	size_t		got = 0;
	int			save_errno;

	fd = OpenTransientFile(path, O_RDONLY | PG_BINARY | O_NONBLOCK);
	if (fd < 0)
	{
		save_errno = errno;
		password_file_ignored(save_errno,
							  psprintf(_("Could not open \"%s\": %m."), path));
		return NULL;
	}
	if (fstat(fd, &st) != 0)
	{
		save_errno = errno;
		password_file_ignored(save_errno,
							  psprintf(_("Could not stat \"%s\": %m."), path));
	}
	else if (!S_ISREG(st.st_mode))
		password_file_ignored(0,
							  psprintf(_("\"%s\" is not a regular file."), path));
	else if (st.st_mode & (S_IRWXG | S_IRWXO))
		password_file_ignored(0,
							  psprintf(_("\"%s\" is accessible by group or others: make it accessible to the server's operating system user only (chmod 0600)."),
									   path));
	else if (st.st_size > RL_PASSWORD_FILE_MAX)
		password_file_ignored(0,
							  psprintf(_("\"%s\" is larger than %d bytes."),
									   path, RL_PASSWORD_FILE_MAX));
	else
	{
		buf = palloc(st.st_size + 1);
		while (got < (size_t) st.st_size)
		{
			ssize_t		n = read(fd, buf + got, st.st_size - got);

			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
			{
				save_errno = errno;
				password_file_ignored(save_errno,
									  psprintf(_("Could not read \"%s\": %m."), path));
				explicit_bzero(buf, got);
				pfree(buf);
				buf = NULL;
				break;
			}
			if (n == 0)
				break;			/* shrank meanwhile: what is there */
			got += n;
		}
		if (buf != NULL)
			buf[got] = '\0';
	}
	CloseTransientFile(fd);
	*len = got;
	return buf;
}

/*
 * The password for a connection to ep from redis_lock.password_file,
 * palloc'd (the caller zeroes and frees it), or NULL: the setting is empty,
 * the file is ignored (with a WARNING), or no line names ep.  A line is
 * host:port:user:password, "*" in any of the first three matches anything,
 * "\:" and "\\" stand for ":" and "\", a line starting with "#" is a
 * comment; the first line that names ep wins.  A URL without a user is
 * Redis' user "default".  A malformed line is skipped with a WARNING naming
 * its number, never its content.  Read anew at each call: connections are
 * cached, so that is once per connection.
 */
char *
rl_password_file_lookup(const RLEndpoint *ep)
{
	const char *path = rl_password_file;
	char	   *buf;
	size_t		len;
	char	   *pw;
	char	   *line;
	char	   *result = NULL;
	int			lineno = 0;

	if (path == NULL || path[0] == '\0')
		return NULL;
	buf = password_file_read(path, &len);
	if (buf == NULL)
		return NULL;
	pw = palloc(len + 1);
	for (line = buf; line < buf + len && result == NULL;)
	{
		char	   *nl = memchr(line, '\n', buf + len - line);
		char	   *end = nl != NULL ? nl : buf + len;
		char	   *next = nl != NULL ? nl + 1 : buf + len;
		bool		malformed;

		lineno++;
		if (end > line && end[-1] == '\r')
			end--;
		if (end > line && line[0] != '#')
		{
			if (password_file_line_matches(line, end, ep, pw, &malformed))
				result = pstrdup(pw);
			else if (malformed)
				ereport(WARNING,
						(errcode(ERRCODE_CONFIG_FILE_ERROR),
						 errmsg("skipping line %d of the Redis password file",
								lineno),
						 errdetail("A line is host:port:user:password; a \":\" or \"\\\" inside a field is written \"\\:\" or \"\\\\\"."),
						 errdetail_log("In \"%s\". A line is host:port:user:password; a \":\" or \"\\\" inside a field is written \"\\:\" or \"\\\\\".",
									   path)));
		}
		line = next;
	}
	explicit_bzero(pw, len + 1);
	pfree(pw);
	explicit_bzero(buf, len);
	pfree(buf);
	return result;
}
