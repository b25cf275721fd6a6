// A redsync v4 (go-redis v9) client driven line by line from the interop
// tests, like redlock_peer.js: one Mutex at a time, on one or more masters.
//
//	redsyncpeer PORT[,PORT...]
//
// stdin:  {"op":"lock","key":"k","ttl":5000,"tries":1,"retryDelay":50}
//
//	{"op":"unlock"} {"op":"extend"} {"op":"quit"}
//
// stdout: one JSON object per command: {"ok":true,...} or {"ok":false,"error":"..."}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"
)

type command struct {
	Op         string `json:"op"`
	Key        string `json:"key"`
	TTL        int    `json:"ttl"`
	Tries      int    `json:"tries"`
	RetryDelay int    `json:"retryDelay"`
}

type answer struct {
	OK      bool   `json:"ok"`
	Value   string `json:"value,omitempty"`
	Until   int64  `json:"until,omitempty"`
	Elapsed int64  `json:"elapsedMs,omitempty"`
	Error   string `json:"error,omitempty"`
}

func main() {
	// README: redsync-setup
	var pools []redis.Pool
	for _, port := range strings.Split(os.Args[1], ",") {
		client := goredislib.NewClient(&goredislib.Options{
			Addr: "127.0.0.1:" + port, DialTimeout: time.Second,
			ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1,
		})
		pools = append(pools, goredis.NewPool(client))
	}
	rs := redsync.New(pools...)
	// README: end
	var mutex *redsync.Mutex
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd command
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			_ = out.Encode(answer{Error: err.Error()})
			continue
		}
		var a answer
		var err error
		switch cmd.Op {
		case "lock":
			tries, delay := cmd.Tries, cmd.RetryDelay
			if tries < 1 {
				tries = 1
			}
			if delay < 1 {
				delay = 50
			}
			// README: redsync-lock
			mutex = rs.NewMutex(cmd.Key,
				redsync.WithExpiry(time.Duration(cmd.TTL)*time.Millisecond),
				redsync.WithTries(tries),
				redsync.WithRetryDelay(time.Duration(delay)*time.Millisecond))
			start := time.Now()
			err = mutex.Lock()
			a.Elapsed = time.Since(start).Milliseconds()
			if err == nil {
				a.Value, a.Until = mutex.Value(), mutex.Until().UnixMilli()
			}
		case "unlock":
			var ok bool
			ok, err = mutex.Unlock()
			if err == nil && !ok {
				err = fmt.Errorf("unlock: not held")
			}
		case "extend":
			var ok bool
			ok, err = mutex.Extend()
			if err == nil && !ok {
				err = fmt.Errorf("extend: not held")
			}
			a.Until = mutex.Until().UnixMilli()
			// README: end
		case "quit":
			_ = out.Encode(answer{OK: true})
			return
		default:
			err = fmt.Errorf("unknown op %q", cmd.Op)
		}
		a.OK = err == nil
		if err != nil {
			a.Error = err.Error()
		}
		_ = out.Encode(a)
	}
}
