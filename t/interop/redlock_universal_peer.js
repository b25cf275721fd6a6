// A redlock-universal 0.8.5 client (with ioredis) driven line by line from
// the interop tests, like redlock_peer.js.
//   node redlock_universal_peer.js PORT
// stdin:  {"op":"lock","key":"k","ttl":5000,"retryAttempts":0,"retryDelay":10}
//         {"op":"unlock"} {"op":"extend","ttl":5000} {"op":"quit"}
// stdout: one JSON object per command: {"ok":true,...} or {"ok":false,"error":"..."}
'use strict';
const Redis = require('ioredis');
const { createLock, IoredisAdapter } = require('redlock-universal');
const readline = require('readline');

const port = Number(process.argv[2]);
const client = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1, connectTimeout: 1000 });
const adapter = new IoredisAdapter(client);
let lock = null;
let handle = null;

function reply(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

async function handleCommand(cmd) {
  try {
    switch (cmd.op) {
      // README: redlock-universal
      case 'lock': {
        lock = createLock({
          adapter,
          key: cmd.key,
          ttl: cmd.ttl,
          retryAttempts: cmd.retryAttempts === undefined ? 0 : cmd.retryAttempts,
          retryDelay: cmd.retryDelay || 10,
        });
        handle = await lock.acquire();
        return reply({ ok: true, value: handle.value });
      }
      case 'unlock':
        return reply({ ok: await lock.release(handle) });
      case 'extend':
        return reply({ ok: await lock.extend(handle, cmd.ttl) });
      // README: end
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
rl.on('line', (line) => { chain = chain.then(() => handleCommand(JSON.parse(line))); });
rl.on('close', () => { chain.then(() => process.exit(0)); });
