// npm redis-semaphore 5.8.0 (Semaphore, MultiSemaphore) driven line by line
// from the interop tests (t/test_semaphore_npm.py).
//   node semaphore_peer.js PORT
// stdin, one JSON command a line; `name` is this peer's handle for one
// semaphore object (default: the key), so one peer can hold several:
//   {"op":"acquire","name":"a","key":"k","limit":3,"permits":2,
//    "lockTimeout":10000,"acquireTimeout":10000,"retryInterval":10,
//    "refreshInterval":0,"acquireAttemptsLimit":1}
//       permits given: a MultiSemaphore, else a Semaphore.  refreshInterval
//       defaults to 0 (no timer: the test refreshes).  Answers
//       {"ok":true,"acquired":bool,"identifier":...} (tryAcquire: false when
//       acquireTimeout / acquireAttemptsLimit ran out).
//   {"op":"refresh","name":"a"}   the library's own refresh: {"refreshed":bool}
//   {"op":"release","name":"a"}   {"ok":true}
//   {"op":"state","name":"a"}     {"acquired":bool,"lost":null|"message"}
//   {"op":"quit"}
// stdout: one JSON object per command, {"ok":true,...} or {"ok":false,"error":"..."}
'use strict';
const Redis = require('ioredis');
const { Semaphore, MultiSemaphore } = require('redis-semaphore');
const readline = require('readline');

const client = new Redis({ host: '127.0.0.1', port: Number(process.argv[2]),
  maxRetriesPerRequest: 1, connectTimeout: 1000 });
const held = new Map();   // name -> semaphore object
const lost = new Map();   // name -> LostLockError message from the refresh timer

function reply(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

function options(cmd, name) {
  const o = {
    lockTimeout: cmd.lockTimeout === undefined ? 10000 : cmd.lockTimeout,
    acquireTimeout: cmd.acquireTimeout === undefined ? 10000 : cmd.acquireTimeout,
    retryInterval: cmd.retryInterval === undefined ? 10 : cmd.retryInterval,
    refreshInterval: cmd.refreshInterval === undefined ? 0 : cmd.refreshInterval,
    // the default throws inside a timer and would kill the peer
    onLockLost: (e) => { lost.set(name, e.message); },
  };
  if (cmd.acquireAttemptsLimit !== undefined) o.acquireAttemptsLimit = cmd.acquireAttemptsLimit;
  return o;
}

async function handle(cmd) {
  const name = cmd.name || cmd.key;
  try {
    switch (cmd.op) {
      case 'acquire': {
        const sem = cmd.permits === undefined
          ? new Semaphore(client, cmd.key, cmd.limit, options(cmd, name))
          : new MultiSemaphore(client, cmd.key, cmd.limit, cmd.permits, options(cmd, name));
        lost.delete(name);
        const acquired = await sem.tryAcquire();
        if (acquired) held.set(name, sem);
        return reply({ ok: true, acquired, identifier: sem.identifier });
      }
      case 'refresh': {
        // what the library's refresh timer runs (no public method for it)
        const refreshed = await held.get(name)._refresh();
        return reply({ ok: true, refreshed: !!refreshed });
      }
      case 'release':
        await held.get(name).release();
        held.delete(name);
        return reply({ ok: true });
      case 'state': {
        const sem = held.get(name);
        return reply({ ok: true, acquired: !!(sem && sem.isAcquired), lost: lost.get(name) || null });
      }
      case 'quit':
        client.disconnect();
        reply({ ok: true });
        return process.exit(0);
      default:
        return reply({ ok: false, error: 'unknown op ' + cmd.op });
    }
  } catch (e) {
    return reply({ ok: false, error: e.name + ': ' + e.message });
  }
}

const rl = readline.createInterface({ input: process.stdin });
let chain = Promise.resolve();
rl.on('line', (line) => { chain = chain.then(() => handle(JSON.parse(line))); });
rl.on('close', () => { chain.then(() => process.exit(0)); });
