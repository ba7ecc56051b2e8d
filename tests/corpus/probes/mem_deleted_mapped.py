# kind: memory (a mapped file in /tmp that was deleted afterwards)
# variants: private shared-ro private-written
# refusal-names: deleted
from _probe import *
N = 4 * PAGE
path = '/tmp/mapped-then-deleted'
with open(path, 'wb') as f:
    f.write(b'd' * N)
fd = os.open(path, os.O_RDONLY)
a = mmap(N, PROT_READ | (PROT_WRITE if VARIANT == 'private-written' else 0),
         MAP_SHARED if VARIANT == 'shared-ro' else MAP_PRIVATE, fd)
os.close(fd)
os.unlink(path)
if VARIANT == 'private-written':
    ctypes.memmove(a, b'W' * PAGE, PAGE)


def check():
    want = (b'W' * PAGE + b'd' * (N - PAGE)) if VARIANT == 'private-written' else b'd' * N
    expect(ctypes.string_at(a, N) == want, 'deleted mapping contents differ')
    expect(mapping(a)[1].endswith('(deleted)'), f'mapping name {mapping(a)[1]}')
