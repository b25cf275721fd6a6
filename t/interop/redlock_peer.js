// A node-redlock 4.2.0 client driven line by line from the interop tests.
//   node redlock_peer.js PORT[,PORT...]
// stdin:  {"op":"lock","key":"k","ttl":5000,"retryCount":0}
//         {"op":"unlock"} {"op":"extend","ttl":5000} {"op":"quit"}
// stdout: one JSON object per command: {"ok":true,...} or {"ok":false,"error":"..."}
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');
const readline = require('readline');

const ports = process.argv[2].split(',').map(Number);
const clients = ports.map((port) => new Redis({ host: '127.0.0.1', port, lazyConnect: false,
  maxRetriesPerRequest: 1, connectTimeout: 1000 }));
let redlock = null;
let current = null;

function reply(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

async function handle(cmd) {
  try {
    switch (cmd.op) {
      // README: redlock
      case 'lock': {
        redlock = new Redlock(clients, {
          driftFactor: 0.01,
          retryCount: cmd.retryCount === undefined ? 0 : cmd.retryCount,
          retryDelay: cmd.retryDelay || 50,
          retryJitter: 10,
        });
        redlock.on('clientError', () => {});
        current = await redlock.lock(cmd.key, cmd.ttl);
        return reply({ ok: true, value: current.value, expiration: current.expiration });
      }
      case 'unlock':
        await current.unlock();
        return reply({ ok: true });
      case 'extend':
        current = await current.extend(cmd.ttl);
        return reply({ ok: true, expiration: current.expiration });
      // README: end
      case 'quit':
        clients.forEach((c) => c.disconnect());
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
