"""AES-256-CTR encryption with the pure-Python `pyaes` package (vHive "pyaes").

pyaes 1.6.1 is published as an sdist only (no wheel), and the sample build
installs binary wheels only, so the unmodified package from the PyPI sdist
(pyaes-1.6.1.tar.gz, sha256 02c1b1405c38d3c370b085fb952dd8bea3fadcee6411ad99
f312cc129c536d8f) is vendored in ./pyaes/ with its MIT LICENSE.txt.

Event: {"text": str (default: a fixed ~1 KiB message), "rounds": int (default 1)}.
Each round encrypts the previous round's output with a fresh CTR stream
(counter initial value = round number), so the ciphertext depends on both
inputs; the handler then decrypts in reverse to check the round trip, like
the vHive function does.  Returns the sha256 and length of the ciphertext.
"""

import hashlib

import pyaes

# fixed 256-bit key, derived at import time
KEY = hashlib.sha256(b"thaw-sample-pyaes-key").digest()

DEFAULT_TEXT = " ".join(
    "the quick brown fox jumps over the lazy dog %d" % i for i in range(24))
MAX_TEXT = 1 << 20
MAX_ROUNDS = 100


def _ctr(initial_value):
    return pyaes.AESModeOfOperationCTR(KEY, counter=pyaes.Counter(initial_value=initial_value))


def _crypt(data, rounds):
    for r in range(rounds):
        data = _ctr(r + 1).encrypt(data)
    return data


def _uncrypt(data, rounds):
    for r in reversed(range(rounds)):
        data = _ctr(r + 1).decrypt(data)
    return data


# warm every code path once (bytecode, lazily created objects)
assert _uncrypt(_crypt(b"warm-up block 0123456789", 2), 2) == b"warm-up block 0123456789"


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    text = event.get("text", DEFAULT_TEXT)
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    rounds = int(event.get("rounds", 1))
    if not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError("rounds must be in 1..%d" % MAX_ROUNDS)
    plain = text.encode("utf-8")
    if len(plain) > MAX_TEXT:
        raise ValueError("text longer than %d bytes" % MAX_TEXT)
    cipher = _crypt(plain, rounds)
    return {
        "rounds": rounds,
        "plaintext_len": len(plain),
        "ciphertext_len": len(cipher),
        "sha256": hashlib.sha256(cipher).hexdigest(),
        "roundtrip_ok": _uncrypt(cipher, rounds) == plain,
    }
