// Exercises the event loop inside invocations: timers, promises, fs, crypto.
// Deterministic parts are returned under "deterministic", random ones under "random".
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');

const bundled = fs.readFileSync(path.join(__dirname, 'data.txt'), 'utf8');
const initAt = Date.now();
let invocations = 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

exports.handler = async (event) => {
  invocations += 1;
  const t0 = Date.now();
  await sleep(5);
  const order = [];
  await Promise.all([
    sleep(3).then(() => order.push('timer-3ms')),
    Promise.resolve().then(() => order.push('microtask')),
    new Promise((r) => setImmediate(() => { order.push('immediate'); r(); })),
  ]);
  const again = await fs.promises.readFile(path.join(__dirname, 'data.txt'), 'utf8');
  const key = await new Promise((res, rej) => crypto.scrypt('secret', 'salt', 16, (e, k) => (e ? rej(e) : res(k))));
  return {
    deterministic: {
      bundledSha256: crypto.createHash('sha256').update(bundled).digest('hex'),
      sameAsync: again === bundled,
      md5OfInput: crypto.createHash('md5').update(JSON.stringify(event || {})).digest('hex'),
      scrypt: key.toString('hex'),
      order,
    },
    random: {
      bytes: crypto.randomBytes(16).toString('hex'),
      uuid: crypto.randomUUID(),
      elapsedMs: Date.now() - t0,
      sinceInitMs: Date.now() - initAt,
      invocations,
    },
  };
};
