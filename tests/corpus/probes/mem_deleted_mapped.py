# kind: memory (a mapped file in /tmp that was deleted afterwards)
# variants: private shared-ro private-written held-shared
# refusal-names: deleted
from _probe import *
N = 4 * PAGE
path = '/tmp/mapped-then-deleted'
with open(path, 'wb') as f:
    f.write(b'd' * N)
held = VARIANT == 'held-shared'
fd = os.open(path, os.O_RDWR if held else os.O_RDONLY)
a = mmap(N, PROT_READ | (PROT_WRITE if VARIANT in ('private-written', 'held-shared') else 0),
         MAP_SHARED if VARIANT in ('shared-ro', 'held-shared') else MAP_PRIVATE, fd)
if not held:
    os.close(fd)
os.unlink(path)
if VARIANT in ('private-written', 'held-shared'):
    ctypes.memmove(a, b'W' * PAGE, PAGE)


def check():
    want = (b'W' * PAGE + b'd' * (N - PAGE)) if VARIANT in ('private-written', 'held-shared') else b'd' * N
    expect(ctypes.string_at(a, N) == want, 'deleted mapping contents differ')
    expect(mapping(a)[1].endswith('(deleted)'), f'mapping name {mapping(a)[1]}')
    expect(not os.path.exists(path), f'{path} exists again')
    if held:
        # One file: the descriptor reads what the mapping wrote.
        expect(os.pread(fd, N, 0) == want, 'the descriptor and the mapping are no longer one file')
