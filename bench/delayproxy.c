/*
 * delayproxy: a TCP proxy on 127.0.0.1 that delivers every chunk it reads,
 * each way, a fixed number of microseconds after reading it -- a network
 * whose round trip is that many microseconds longer, twice over, without
 * head-of-line waits (chunks are queued, not slept on).  For bench/run's
 * latency section: the test bed's Python proxy (t/testbed.py DelayProxy)
 * can only delay by whole milliseconds, since epoll's timeout is in
 * milliseconds; here a timerfd (hrtimer) paces delivery to the microsecond
 * without spinning.
 *
 *	 delayproxy LISTEN_PORT TARGET_PORT DELAY_US
 *
 * Runs until killed.  Prints "ready" once listening.  Not part of the
 * extension; bench/run compiles it with the system's cc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_PIPES 256
#define CHUNK 65536

typedef struct Chunk
{
	struct Chunk *next;
	uint64_t	due;			/* ns, CLOCK_MONOTONIC */
	size_t		len;
	size_t		off;
	char		data[];
} Chunk;

/* One direction of one connection: bytes read from `from`, for `to` */
typedef struct Pipe
{
	int			from;
	int			to;
	Chunk	   *head;
	Chunk	   *tail;
	int			peer;			/* index of the other direction */
	int			used;
} Pipe;

static Pipe pipes[MAX_PIPES];
static uint64_t delay_ns;
static int	ep;
static int	tfd;

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static void
arm(void)
{
	uint64_t	first = 0;
	struct itimerspec its;
	int			i;

	for (i = 0; i < MAX_PIPES; i++)
		if (pipes[i].used && pipes[i].head &&
			(first == 0 || pipes[i].head->due < first))
			first = pipes[i].head->due;
	memset(&its, 0, sizeof(its));
	if (first != 0)
	{
		its.it_value.tv_sec = first / 1000000000u;
		its.it_value.tv_nsec = first % 1000000000u;
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1;
	}
	timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void
close_pair(int i)
{
	int			j = pipes[i].peer;
	int			k;

	for (k = 0; k < 2; k++)
	{
		Pipe	   *p = &pipes[k == 0 ? i : j];

		while (p->head)
		{
			Chunk	   *c = p->head;

			p->head = c->next;
			free(c);
		}
		p->tail = NULL;
		p->used = 0;
	}
	close(pipes[i].from);
	close(pipes[i].to);
}

/* Write what is due on pipe i; 0 on success, -1 when the pair died */
static int
deliver(int i, uint64_t now)
{
	Pipe	   *p = &pipes[i];

	while (p->head && p->head->due <= now)
	{
		Chunk	   *c = p->head;
		ssize_t		n = write(p->to, c->data + c->off, c->len - c->off);

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;			/* the rest when the timer fires again */
		if (n <= 0)
			return -1;
		c->off += n;
		if (c->off < c->len)
			continue;
		p->head = c->next;
		if (p->head == NULL)
			p->tail = NULL;
		free(c);
	}
	return 0;
}

static int
new_pipe(int from, int to)
{
	int			i;

	for (i = 0; i < MAX_PIPES; i++)
		if (!pipes[i].used)
		{
			memset(&pipes[i], 0, sizeof(Pipe));
			pipes[i].used = 1;
			pipes[i].from = from;
			pipes[i].to = to;
			return i;
		}
	return -1;
}

static void
accept_one(int lfd, int target_port)
{
	int			c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
	int			s;
	int			a,
				b;
	int			one = 1;
	struct sockaddr_in sa;
	struct epoll_event ev;

	if (c < 0)
		return;
	s = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(target_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (s < 0 || connect(s, (struct sockaddr *) &sa, sizeof(sa)) != 0)
	{
		close(c);
		if (s >= 0)
			close(s);
		return;
	}
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	a = new_pipe(c, s);
	b = a < 0 ? -1 : new_pipe(s, c);
	if (b < 0)
	{
		if (a >= 0)
			pipes[a].used = 0;
		close(c);
		close(s);
		return;
	}
	pipes[a].peer = b;
	pipes[b].peer = a;
	ev.events = EPOLLIN;
	ev.data.u32 = (uint32_t) a + 2;
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
	ev.data.u32 = (uint32_t) b + 2;
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
}

int
main(int argc, char **argv)
{
	int			lfd;
	int			one = 1;
	int			target_port;
	struct sockaddr_in sa;
	struct epoll_event ev;
	struct epoll_event evs[64];

	if (argc != 4)
	{
		fprintf(stderr, "usage: delayproxy LISTEN_PORT TARGET_PORT DELAY_US\n");
		return 2;
	}
	target_port = atoi(argv[2]);
	delay_ns = (uint64_t) atoll(argv[3]) * 1000u;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(atoi(argv[1]));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) != 0 || listen(lfd, 128) != 0)
	{
		perror("delayproxy: listen");
		return 1;
	}
	ep = epoll_create1(0);
	tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
	ev.events = EPOLLIN;
	ev.data.u32 = 0;
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	ev.data.u32 = 1;
	epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
	printf("ready\n");
	fflush(stdout);

	for (;;)
	{
		int			n = epoll_wait(ep, evs, 64, -1);
		int			k;
		uint64_t	now;

		if (n < 0 && errno == EINTR)
			continue;
		for (k = 0; k < n; k++)
		{
			uint32_t	id = evs[k].data.u32;

			if (id == 0)
				accept_one(lfd, target_port);
			else if (id == 1)
			{
				uint64_t	expirations;

				(void) !read(tfd, &expirations, sizeof(expirations));
			}
			else if (pipes[id - 2].used)
			{
				Pipe	   *p = &pipes[id - 2];
				Chunk	   *c = malloc(sizeof(Chunk) + CHUNK);
				ssize_t		r = read(p->from, c->data, CHUNK);

				if (r <= 0)
				{
					free(c);
					if (r < 0 && errno == EAGAIN)
						continue;
					close_pair(id - 2);
					continue;
				}
				c->len = r;
				c->off = 0;
				c->next = NULL;
				c->due = now_ns() + delay_ns;
				if (p->tail)
					p->tail->next = c;
				else
					p->head = c;
				p->tail = c;
			}
		}
		now = now_ns();
		for (k = 0; k < MAX_PIPES; k++)
			if (pipes[k].used && deliver(k, now) != 0)
				close_pair(k);
		arm();
	}
}
