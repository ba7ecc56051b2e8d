# kind: memory (a private mapping of a library file: untouched, and copy-on-written)
# variants: clean written mostly-written
# refusal-names: mapping
from _probe import *
import hashlib
path = '/usr/lib/x86_64-linux-gnu/libc.so.6'
size = os.path.getsize(path) // PAGE * PAGE
fd = os.open(path, os.O_RDONLY)
a = mmap(size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd)
os.close(fd)
n = {'clean': 0, 'written': 2, 'mostly-written': size // PAGE}[VARIANT]
for i in range(n):
    ctypes.memmove(a + i * PAGE, struct.pack('<Q', i) * (PAGE // 8), PAGE)
WANT = hashlib.sha256(ctypes.string_at(a, size)).hexdigest()


def check():
    got = hashlib.sha256(ctypes.string_at(a, size)).hexdigest()
    expect(got == WANT, f'private file mapping differs ({n} pages written)')
