'use strict';
/*
 * Thaw Node.js runtime shim (AWS Lambda nodejs20.x conventions).
 *
 * Started inside the sandbox by /var/runtime/nodejs/bootstrap.sh as
 *
 *     /usr/bin/node --v8-pool-size=1 --expose-gc --max-old-space-size=N ... /var/runtime/nodejs/bootstrap.js
 *
 * with cwd = $LAMBDA_TASK_ROOT (/var/task) and _HANDLER=file.function.
 * fd 0 = /dev/null, fd 1/2 = the function's log pipe, fd 3 = the control
 * channel (connected AF_UNIX SOCK_STREAM).  The wire protocol is the one of
 * the Python shim (runtimes/python/README.md); runtimes/nodejs/README.md
 * documents the Node specifics.
 *
 * Snapshot rules this file obeys: the control socket is never handed to
 * libuv (that would make it non-blocking and register it with epoll); it is
 * only used through fs.readSync / fs.writeSync, i.e. plain read(2)/write(2).
 * While idle the MAIN thread blocks in read(2) on fd 3.  An invocation runs
 * as: read frame (blocking) -> call the handler -> `await` its completion
 * (this returns to the libuv event loop, so timers, promises, fs and crypto
 * work normally) -> write the reply (blocking) -> read the next frame
 * (blocking, inside the same promise continuation, so the event loop is
 * parked until the next frame arrives).  No npm dependencies.
 */

const fs = require('fs');
const path = require('path');
const util = require('util');
const v8 = require('v8');

const CONTROL_FD = 3;
const MAX_FRAME = 64 * 1024 * 1024;
const SLEEP_CELL = new Int32Array(new SharedArrayBuffer(4));

function sleepMs(ms) {
  Atomics.wait(SLEEP_CELL, 0, 0, ms);
}

class ChannelClosed extends Error {}
class ProtocolError extends Error {}

// --------------------------------------------------------------------------
// raw fd I/O: plain blocking read(2)/write(2) via libuv's synchronous fs calls
// --------------------------------------------------------------------------

function isClosedError(e) {
  return e && (e.code === 'ECONNRESET' || e.code === 'EPIPE' || e.code === 'ENOTCONN' || e.code === 'EBADF');
}

function readSome(fd, buf, off, len) {
  for (;;) {
    try {
      return fs.readSync(fd, buf, off, len, null);
    } catch (e) {
      if (e.code === 'EINTR') continue;
      // Only if somebody made the descriptor non-blocking (the shim never
      // does): degrade to polling instead of failing.
      if (e.code === 'EAGAIN' || e.code === 'EWOULDBLOCK') { sleepMs(1); continue; }
      throw e;
    }
  }
}

function writeAll(fd, buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off, buf.length - off);
    } catch (e) {
      if (e.code === 'EINTR') continue;
      if (e.code === 'EAGAIN' || e.code === 'EWOULDBLOCK') { sleepMs(1); continue; }
      throw e;
    }
  }
}

function readExact(n) {
  const buf = Buffer.allocUnsafe(n);
  let got = 0;
  while (got < n) {
    let r;
    try {
      // <- the engine snapshots the process blocked in this read(2)
      r = readSome(CONTROL_FD, buf, got, n - got);
    } catch (e) {
      if (isClosedError(e)) throw new ChannelClosed();
      throw e;
    }
    if (r === 0) throw new ChannelClosed();
    got += r;
  }
  return buf;
}

function recv() {
  const n = readExact(4).readUInt32BE(0);
  if (n > MAX_FRAME) throw new ProtocolError(`frame of ${n} bytes exceeds the 64 MiB limit`);
  const body = n ? readExact(n) : Buffer.alloc(0);
  let msg;
  try {
    msg = JSON.parse(body.toString('utf8'));
  } catch (e) {
    throw new ProtocolError(`frame is not valid JSON: ${e.message}`);
  }
  if (msg === null || typeof msg !== 'object' || Array.isArray(msg)) throw new ProtocolError('frame is not a JSON object');
  return msg;
}

// JSON text with every non-ASCII code unit escaped (frames are pure ASCII).
function asciiJson(value) {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g,
    (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

function send(msg) {
  let body = Buffer.from(asciiJson(msg), 'latin1');
  if (body.length > MAX_FRAME) {
    const big = msg.type === 'result'
      ? resultError('Runtime.ResponseSizeTooLarge', `Response of ${body.length} bytes exceeds the 64 MiB frame limit`, [])
      : { type: 'init_error', errorType: 'Runtime.ResponseSizeTooLarge', errorMessage: 'init_error frame too large', stackTrace: [] };
    body = Buffer.from(asciiJson(big), 'latin1');
  }
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(body.length, 0);
  try {
    writeAll(CONTROL_FD, Buffer.concat([head, body]));
  } catch (e) {
    if (isClosedError(e)) throw new ChannelClosed();
    throw e;
  }
}

// --------------------------------------------------------------------------
// logging: console writes synchronously to fd 1 / fd 2 (flushed before the
// reply; process.stdout is not even created unless the function uses it)
// --------------------------------------------------------------------------

function installConsole() {
  const { Writable } = require('stream');
  const sink = (fd) => new Writable({
    decodeStrings: true,
    write(chunk, _enc, cb) {
      try { writeAll(fd, chunk); } catch (_) { /* log pipe gone: drop */ }
      cb();
    },
  });
  const c = new console.Console({ stdout: sink(1), stderr: sink(2) });
  for (const k of Object.keys(c)) {
    if (typeof c[k] === 'function') console[k] = c[k];
  }
}

// --------------------------------------------------------------------------
// errors, formatted as Lambda does
// --------------------------------------------------------------------------

function errorParts(err) {
  if (err instanceof Error || (err && typeof err === 'object' && typeof err.message === 'string')) {
    const stack = typeof err.stack === 'string' ? err.stack.split('\n') : [];
    return {
      errorType: err.name || (err.constructor && err.constructor.name) || 'Error',
      errorMessage: String(err.message),
      stackTrace: stack,
    };
  }
  let message;
  try { message = typeof err === 'string' ? err : JSON.stringify(err); } catch (_) { message = String(err); }
  return { errorType: typeof err, errorMessage: message === undefined ? String(err) : message, stackTrace: [] };
}

function resultError(errorType, errorMessage, stackTrace) {
  return { type: 'result', ok: false, error: { errorType, errorMessage, stackTrace } };
}

class InitFault extends Error {
  constructor(errorType, message, stack) {
    super(message);
    this.errorType = errorType;
    this.stackLines = stack || [];
  }
}

// --------------------------------------------------------------------------
// snapshot hooks (globalThis.thaw) and reseeding after a restore
// --------------------------------------------------------------------------

const beforeSnapshotHooks = [];
const afterRestoreHooks = [];

function urandom(n) {
  const buf = Buffer.allocUnsafe(n);
  const fd = fs.openSync('/dev/urandom', 'r');
  try {
    let got = 0;
    while (got < n) got += readSome(fd, buf, got, n - got);
  } finally {
    fs.closeSync(fd);
  }
  return buf;
}

// xorshift128+ (what V8 itself uses), seeded per restored instance.
function makeMathRandom(seed) {
  let s0 = seed.readBigUInt64LE(0) | 1n;
  let s1 = seed.readBigUInt64LE(8) | 2n;
  const M = (1n << 64n) - 1n;
  // Work in two 32-bit halves for speed would be nicer; BigInt keeps it obviously right.
  return function random() {
    let x = s0;
    const y = s1;
    s0 = y;
    x ^= (x << 23n) & M;
    x ^= x >> 17n;
    x ^= y ^ (y >> 26n);
    s1 = x;
    return Number(((s0 + s1) & M) >> 11n) / 9007199254740992;
  };
}

// The V8/OpenSSL generators captured in the snapshot are identical in every
// restored clone. An instance about to be captured replaces the JS-visible
// randomness sources, before the function loads (so references it keeps are the
// replacements): crypto's read /dev/urandom at each call, and Math.random is
// reseeded by every restored clone (`reseed`). Done once, before the snapshot:
// doing it after each restore (loading crypto and WebCrypto) took ~4 ms of every
// restore notice and in-place reset.
function reseed() {
  Math.random = makeMathRandom(urandom(16));
}

function replaceRandomness() {
  reseed();
  const crypto = require('crypto');
  const fill = (view, offset, size) => {
    const u8 = ArrayBuffer.isView(view)
      ? new Uint8Array(view.buffer, view.byteOffset, view.byteLength)
      : new Uint8Array(view);
    offset = offset === undefined ? 0 : offset;
    size = size === undefined ? u8.length - offset : size;
    if (offset < 0 || size < 0 || offset + size > u8.length) throw new RangeError('offset/size out of range');
    if (size > 0) u8.set(urandom(size), offset);
    return view;
  };
  crypto.randomBytes = function randomBytes(size, cb) {
    const buf = urandom(size);
    if (typeof cb === 'function') { process.nextTick(cb, null, buf); return undefined; }
    return buf;
  };
  crypto.pseudoRandomBytes = crypto.randomBytes;
  crypto.prng = crypto.randomBytes;
  crypto.rng = crypto.randomBytes;
  crypto.randomFillSync = function randomFillSync(buf, offset, size) { return fill(buf, offset, size); };
  crypto.randomFill = function randomFill(buf, offset, size, cb) {
    if (typeof offset === 'function') { cb = offset; offset = undefined; size = undefined; }
    else if (typeof size === 'function') { cb = size; size = undefined; }
    fill(buf, offset, size);
    process.nextTick(cb, null, buf);
  };
  const uuid = () => {
    const b = urandom(16);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = b.toString('hex');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  };
  crypto.randomUUID = function randomUUID() { return uuid(); };
  crypto.randomInt = function randomInt(min, max, cb) {
    if (typeof max === 'undefined' || typeof max === 'function') { cb = max; max = min; min = 0; }
    if (!Number.isSafeInteger(min) || !Number.isSafeInteger(max) || max <= min) {
      throw new RangeError(`randomInt: invalid range [${min}, ${max})`);
    }
    const range = max - min;
    const limit = 2 ** 48 - (2 ** 48 % range);
    let x;
    do { x = urandom(6).readUIntBE(0, 6); } while (x >= limit);
    const v = min + (x % range);
    if (typeof cb === 'function') { process.nextTick(cb, null, v); return undefined; }
    return v;
  };
  const getRandomValues = function getRandomValues(view) {
    if (view.byteLength > 65536) throw new RangeError('getRandomValues: more than 65536 bytes requested');
    return fill(view);
  };
  for (const wc of [crypto, crypto.webcrypto, globalThis.crypto]) {
    if (!wc) continue;
    try {
      Object.defineProperty(wc, 'getRandomValues', { value: getRandomValues, configurable: true, writable: true });
      Object.defineProperty(wc, 'randomUUID', { value: uuid, configurable: true, writable: true });
    } catch (_) { /* frozen: leave it */ }
  }
}

async function runHooks(hooks, label) {
  for (const fn of hooks) {
    try {
      await fn();
    } catch (e) {
      throw new InitFault(errorParts(e).errorType, `${label} hook failed: ${errorParts(e).errorMessage}`, errorParts(e).stackTrace);
    }
  }
}

globalThis.thaw = Object.freeze({
  /** fn() (may return a promise) runs once, after init, before the snapshot is taken. */
  registerBeforeSnapshot(fn) {
    if (typeof fn !== 'function') throw new TypeError('registerBeforeSnapshot expects a function');
    beforeSnapshotHooks.push(fn);
  },
  /** fn() (may return a promise) runs in each restored instance before its first invocation. */
  registerAfterRestore(fn) {
    if (typeof fn !== 'function') throw new TypeError('registerAfterRestore expects a function');
    afterRestoreHooks.push(fn);
  },
});

// --------------------------------------------------------------------------
// init: load the handler as Lambda's nodejs20.x runtime does
// --------------------------------------------------------------------------

function tryRequireFile(file, ext) {
  const p = file + (ext || '');
  let st;
  try { st = fs.statSync(p); } catch (_) { return undefined; }
  return st.isFile() ? require(p) : undefined;
}

async function tryImport(file, ext) {
  const p = file + (ext || '');
  if (!fs.existsSync(p)) return undefined;
  const { pathToFileURL } = require('url');
  return import(pathToFileURL(p).href);
}

function packageTypeIsModule(file) {
  let dir = path.dirname(file);
  for (;;) {
    const pj = path.join(dir, 'package.json');
    if (fs.existsSync(pj)) {
      try { return JSON.parse(fs.readFileSync(pj, 'utf8')).type === 'module'; } catch (_) { return false; }
    }
    const up = path.dirname(dir);
    if (up === dir) return false;
    dir = up;
  }
}

async function loadModule(appRoot, moduleRoot, moduleName) {
  const file = path.resolve(appRoot, moduleRoot, moduleName);
  const extless = tryRequireFile(file);
  if (extless) return extless;
  const esm = packageTypeIsModule(file);
  if (!esm) {
    const m = tryRequireFile(file, '.js');
    if (m) return m;
  }
  const m = (esm && (await tryImport(file, '.js'))) || (await tryImport(file, '.mjs')) || tryRequireFile(file, '.cjs');
  if (m) return m;
  // Not a file of the bundle: a package name (node_modules), as Lambda allows.
  const resolved = require.resolve(moduleName, { paths: [appRoot, path.resolve(appRoot, moduleRoot)] });
  return require(resolved);
}

async function loadHandler(appRoot, full) {
  const base = path.basename(full);
  const moduleRoot = full.substring(0, full.length - base.length);
  const match = base.match(/^([^.]*)\.(.*)$/);
  if (!match || !match[1] || !match[2]) {
    throw new InitFault('Runtime.MalformedHandlerName', 'Bad handler');
  }
  const [, moduleName, handlerPath] = match;
  let app;
  try {
    app = await loadModule(appRoot, moduleRoot, moduleName);
  } catch (e) {
    if (e instanceof InitFault) throw e;
    if (e instanceof SyntaxError) {
      throw new InitFault('Runtime.UserCodeSyntaxError', String(e), errorParts(e).stackTrace);
    }
    if (e && (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_MODULE_NOT_FOUND')) {
      throw new InitFault('Runtime.ImportModuleError', String(e), errorParts(e).stackTrace);
    }
    throw e;
  }
  const fn = handlerPath.split('.').reduce((o, k) => (o == null ? undefined : o[k]), app);
  if (fn === undefined || fn === null) {
    throw new InitFault('Runtime.HandlerNotFound', `${full} is undefined or not exported`);
  }
  if (typeof fn !== 'function') {
    throw new InitFault('Runtime.HandlerNotFound', `${full} is not a function`);
  }
  return fn;
}

// --------------------------------------------------------------------------
// invocation
// --------------------------------------------------------------------------

// The invocation in flight (null while idle): lets uncaught errors and an
// emptied event loop finish it.
let current = null;
let exitAfterReply = null;
let initDone = null;

// The version this call runs, and the log stream named after it, come with the
// call: one snapshot (and one warm process) may serve $LATEST and several published
// versions, so the environment captured in the image must not decide what
// AWS_LAMBDA_FUNCTION_VERSION and AWS_LAMBDA_LOG_STREAM_NAME say.
function takeIdentity(msg) {
  const env = process.env;
  const v = msg.function_version;
  if (v && env.AWS_LAMBDA_FUNCTION_VERSION !== v) env.AWS_LAMBDA_FUNCTION_VERSION = v;
  const ls = msg.log_stream_name;
  if (ls && env.AWS_LAMBDA_LOG_STREAM_NAME !== ls) env.AWS_LAMBDA_LOG_STREAM_NAME = ls;
}

function makeContext(msg, finish) {
  takeIdentity(msg);
  const env = process.env;
  const functionName = msg.function_name || env.AWS_LAMBDA_FUNCTION_NAME || '';
  const mem = msg.memory_limit_mb;
  const deadline = msg.deadline_ms === undefined || msg.deadline_ms === null ? null : Number(msg.deadline_ms);
  const context = {
    callbackWaitsForEmptyEventLoop: true,
    functionName,
    functionVersion: msg.function_version || env.AWS_LAMBDA_FUNCTION_VERSION || '$LATEST',
    invokedFunctionArn: msg.invoked_function_arn || '',
    memoryLimitInMB: mem !== undefined && mem !== null ? String(mem) : (env.AWS_LAMBDA_FUNCTION_MEMORY_SIZE || ''),
    awsRequestId: msg.request_id || '',
    logGroupName: env.AWS_LAMBDA_LOG_GROUP_NAME || `/aws/lambda/${functionName}`,
    logStreamName: msg.log_stream_name || env.AWS_LAMBDA_LOG_STREAM_NAME || '',
    identity: undefined,
    clientContext: undefined,
    getRemainingTimeInMillis() {
      return deadline === null ? 0 : Math.max(deadline - Date.now(), 0);
    },
    // legacy (pre-callback) API, still present on nodejs20.x
    succeed(value) { finish(null, value); },
    fail(err) { finish(err === undefined || err === null ? 'handled' : err, undefined); },
    done(err, value) { if (err !== undefined && err !== null) finish(err); else finish(null, value); },
  };
  return context;
}

function marshal(value) {
  let text;
  try {
    text = JSON.stringify(value === undefined ? null : value);
  } catch (e) {
    return resultError('Runtime.MarshalError', `Unable to stringify response body: ${e.message}`, []);
  }
  if (text === undefined) text = 'null'; // e.g. a function
  return { type: 'result', ok: true, result: text };
}

function invoke(handler, msg) {
  return new Promise((resolve) => {
    let event;
    const payload = msg.payload;
    try {
      event = payload === undefined || payload === null || payload === '' ? null : JSON.parse(payload);
    } catch (e) {
      resolve(resultError('Runtime.UnmarshalError', `Unable to unmarshal input: ${e.message}`, []));
      return;
    }
    let settled = false;
    const settle = (err, value) => {
      if (settled) return;
      settled = true;
      current = null;
      resolve(err !== null && err !== undefined
        ? { type: 'result', ok: false, error: errorParts(err) }
        : marshal(value));
    };
    let result; // {err, value} held while waiting for the event loop to drain
    const inflight = {
      settle,
      // called on 'beforeExit': the event loop has nothing left to do
      loopEmpty() {
        if (result) settle(result.err, result.value);
        else if (!settled) settle(null, null); // handler never answered: Lambda returns null
      },
    };
    current = inflight;
    const context = makeContext(msg, (err, value) => settle(err, value));
    const callback = (err, value) => {
      if (result || settled) return;
      if (context.callbackWaitsForEmptyEventLoop) {
        result = { err: err === undefined ? null : err, value };
      } else {
        settle(err === undefined ? null : err, value);
      }
    };
    let r;
    try {
      r = handler(event, context, callback);
    } catch (e) {
      settle(e === undefined || e === null ? new Error(String(e)) : e);
      return;
    }
    if (r && typeof r.then === 'function') {
      r.then((v) => settle(null, v),
        (e) => settle(e === undefined || e === null ? new Error(`handler rejected with ${e}`) : e));
    }
    // otherwise: wait for the callback (or context.succeed/fail/done) or the
    // loop becoming empty
  });
}

function onFatal(kind, err) {
  const parts = errorParts(err);
  if (kind === 'unhandledRejection') {
    parts.errorType = 'Runtime.UnhandledPromiseRejection';
    parts.errorMessage = `${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}`;
  }
  if (current) {
    // As Lambda: the invocation fails with this error, then the runtime exits.
    exitAfterReply = 129;
    const c = current;
    current = null;
    c.settle({ name: parts.errorType, message: parts.errorMessage, stack: parts.stackTrace.join('\n') });
    return;
  }
  if (initDone) {
    initDone({ err: { name: parts.errorType, message: parts.errorMessage, stack: parts.stackTrace.join('\n') } });
    return;
  }
  try { writeAll(2, Buffer.from(`thaw runtime: ${kind}: ${util.inspect(err)}\n`)); } catch (_) { /* ignore */ }
  process.exit(129);
}

// Run, once before the snapshot, the runtime's own paths that every restored
// instance runs around its first invocation (V8 compiles a function on its first
// call), so restored instances do not compile them. The function is not called.
async function warmUp() {
  try {
    const { Writable } = require('stream');
    const quiet = new console.Console({ stdout: new Writable({ write(_c, _e, cb) { cb(); } }) });
    quiet.log(`warm-up ${'x'} (${1})`, { a: [1, 'b'] });
    await invoke(async (event, context) => {
      context.getRemainingTimeInMillis();
      return { ok: event.x };
    }, { payload: '{"x":1}', request_id: 'warm-up', deadline_ms: Date.now() + 1000 });
    asciiJson({ type: 'result', ok: true, result: '"x"' });
    errorParts(new Error('warm-up'));
  } catch (_) { /* best effort */ }
}

// The reply to `restored` (a restored clone): reseed, run the afterRestore hooks.
async function restoredReply(msg) {
  let reply = { type: 'ok' };
  let stage = 'reseeding';
  try {
    reseed();
    stage = 'afterRestore hook';
    for (const h of afterRestoreHooks) await h();
  } catch (e) {
    const p = errorParts(e);
    reply = { type: 'error', errorType: p.errorType, errorMessage: `${stage} failed: ${p.errorMessage}`, stackTrace: p.stackTrace };
  }
  if (msg.nonce !== undefined) reply.nonce = msg.nonce;
  return reply;
}

// The V8 heap in use when the base said ready, and what a function's load may add to
// it before the capture collects the old generation too (see the GC before READY).
let baseHeapUsed = 0;
const LOAD_GARBAGE_BYTES = 2 << 20;

// THAW_BASE=1: this runtime is captured as a *base* (started, warmed up, no
// function loaded; see the engine's layers.rs). Say so, then wait for the node to
// name the function: a "load" frame carries its whole environment (_HANDLER
// included), and `serve` when the instance serves next instead of being captured
// (a repurposed base instance). Returns false if the node said shutdown instead,
// else { serve }.
async function waitAsBase() {
  await warmUp();
  if (typeof globalThis.gc === 'function') globalThis.gc();
  baseHeapUsed = v8.getHeapStatistics().used_heap_size;
  send({ type: 'ready', base: true, restore_notice: true });
  let msg;
  for (;;) {
    msg = recv(); // <- the engine snapshots a base blocked in this read
    if (msg.type === 'load') break;
    if (msg.type === 'restored') send(await restoredReply(msg));
    else if (msg.type === 'shutdown') return false;
    else throw new ProtocolError(`a base expects load, got ${JSON.stringify(msg.type)}`);
  }
  const env = msg.env;
  if (env === null || typeof env !== 'object' || Array.isArray(env) || !Object.values(env).every((v) => typeof v === 'string')) {
    throw new ProtocolError('load carries no environment object of strings');
  }
  for (const k of Object.keys(process.env)) if (!(k in env)) delete process.env[k];
  for (const [k, v] of Object.entries(env)) process.env[k] = v;
  // NODE_PATH is read once at start-up: read it again for the function's value.
  require('module')._initPaths();
  // An idle base instance may have had its code replaced under it (repurposing, see
  // the engine's Instance::load_into): its cwd is still the previous /var/task.
  process.chdir(process.env.LAMBDA_TASK_ROOT || '/var/task');
  return { serve: msg.serve === true };
}

// --------------------------------------------------------------------------
// main
// --------------------------------------------------------------------------

function exitNow(code) {
  // process.exit runs 'exit' listeners only; nothing of ours is buffered.
  process.exit(code);
}

async function init(appRoot) {
  const handlerName = process.env._HANDLER || '';
  try {
    const fn = await loadHandler(appRoot, handlerName);
    await runHooks(beforeSnapshotHooks, 'beforeSnapshot');
    return { fn };
  } catch (e) {
    if (e instanceof InitFault) {
      return { error: { type: 'init_error', errorType: e.errorType, errorMessage: e.message, stackTrace: e.stackLines } };
    }
    const p = errorParts(e);
    return { error: { type: 'init_error', errorType: p.errorType, errorMessage: p.errorMessage, stackTrace: p.stackTrace } };
  }
}

async function main() {
  installConsole();
  process.on('uncaughtException', (e) => onFatal('uncaughtException', e));
  process.on('unhandledRejection', (e) => onFatal('unhandledRejection', e));
  process.on('beforeExit', () => {
    if (current) current.loopEmpty();
    else if (initDone) initDone({ err: new InitFault('Runtime.ImportModuleError', 'the module\'s initialization never settled (top-level await on a promise that cannot resolve)') });
  });

  if (process.env.THAW_SNAPSHOT === '1') replaceRandomness();
  const base = process.env.THAW_BASE === '1';
  // A function loaded into a base instance that serves next (not captured).
  let serving = false;
  if (base) {
    try {
      const loaded = await waitAsBase();
      if (!loaded) { exitNow(0); return; }
      serving = loaded.serve;
    } catch (e) {
      if (e instanceof ChannelClosed) { exitNow(0); return; }
      const what = e instanceof ProtocolError ? 'protocol error' : 'internal error';
      try { writeAll(2, Buffer.from(`thaw runtime: ${what}: ${e instanceof ProtocolError ? e.message : util.inspect(e)}\n`)); } catch (_) { /* ignore */ }
      exitNow(e instanceof ProtocolError ? 2 : 3);
      return;
    }
  }
  const appRoot = process.env.LAMBDA_TASK_ROOT || '/var/task';
  // Init races against a fatal error / an emptied loop during init.
  const outcome = await new Promise((resolve) => {
    initDone = resolve;
    init(appRoot).then(resolve);
  });
  initDone = null;
  let fn = outcome.fn;
  let initError = outcome.error;
  if (outcome.err) {
    const e = outcome.err;
    initError = e instanceof InitFault
      ? { type: 'init_error', errorType: e.errorType, errorMessage: e.message, stackTrace: e.stackLines }
      : { type: 'init_error', errorType: e.name, errorMessage: e.message, stackTrace: String(e.stack || '').split('\n') };
  }
  if (initError) {
    try { send(initError); } catch (_) { /* node gone */ }
    exitNow(1);
    return;
  }
  // Only an instance about to be captured warms up (a plain cold boot would just be
  // slower); a base warmed up before the function loaded.
  if (process.env.THAW_SNAPSHOT === '1' && !base) await warmUp();
  // A function loaded into a base: what its module queued at start-up (next ticks,
  // promise jobs, immediates: a server's listen, a connection) runs before the capture,
  // as the warm-up lets it run before a full image's.
  else if (base) await new Promise((resolve) => setImmediate(resolve));
  // Compact the heap so the snapshot holds live objects only (not worth its ~10 ms
  // when no snapshot follows). A function loaded into a base is captured as a diff on
  // it, where a full GC costs pages: it compacts the old space the base holds, moving
  // objects across pages that were the base's, and marking writes the mark bits of
  // every page with live objects; the diff then stores all of them (helloworld's diff
  // 634 pages with a full GC, 704 with a non-moving one, 381 with a young-generation
  // GC only). So a load that left little behind (helloworld and most functions add
  // ~0.4 MB) gets a young-generation GC only. One that allocated a lot at init
  // (imageresize: 7.8 MB) gets a full GC that does not move objects: without it its
  // garbage stays in the snapshot and its first call's GC walks it (a working set of
  // 4,809 pages against 3,235; 92.6 ms to the first response against 79.6, its full
  // image 74.4, same run); with compaction 88 ms.
  if (typeof globalThis.gc === 'function' && !serving) {
    if (!base) globalThis.gc();
    else if (v8.getHeapStatistics().used_heap_size - baseHeapUsed > LOAD_GARBAGE_BYTES) {
      v8.setFlagsFromString('--never-compact');
      try {
        globalThis.gc();
      } finally {
        v8.setFlagsFromString('--no-never-compact');
      }
    } else globalThis.gc({ type: 'minor' });
  }

  try {
    send({ type: 'ready' });
    for (;;) {
      const msg = recv(); // blocking read(2) on fd 3, main thread
      switch (msg.type) {
        case 'invoke': {
          const reply = await invoke(fn, msg); // runs the event loop until the handler is done
          // The node takes a reply only with its request's nonce (anything else on the
          // channel is stale or was written by the function itself).
          if (msg.nonce !== undefined) reply.nonce = msg.nonce;
          send(reply);
          if (exitAfterReply !== null) exitNow(exitAfterReply);
          break;
        }
        case 'restored':
          send(await restoredReply(msg));
          break;
        case 'shutdown':
          exitNow(0);
          return;
        default:
          throw new ProtocolError(`unknown message type ${JSON.stringify(msg.type)}`);
      }
    }
  } catch (e) {
    if (e instanceof ChannelClosed) exitNow(0);
    else if (e instanceof ProtocolError) {
      try { writeAll(2, Buffer.from(`thaw runtime: protocol error: ${e.message}\n`)); } catch (_) { /* ignore */ }
      exitNow(2);
    } else {
      try { writeAll(2, Buffer.from(`thaw runtime: internal error: ${util.inspect(e)}\n`)); } catch (_) { /* ignore */ }
      exitNow(3);
    }
  }
}

main();
