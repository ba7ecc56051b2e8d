// Randomness after a restore: two instances restored from one snapshot must
// return different values (the runtime reseeds on the "restored" frame).
const crypto = require('crypto');
// Kept at init, as libraries do: must still differ per restored instance.
const { randomBytes } = require('crypto');
const atInit = { math: Math.random(), bytes: crypto.randomBytes(8).toString('hex') };

exports.handler = async () => ({
  math: Math.random(),
  bytes: crypto.randomBytes(16).toString('hex'),
  uuid: crypto.randomUUID(),
  captured: randomBytes(16).toString('hex'),
  atInit,
});
