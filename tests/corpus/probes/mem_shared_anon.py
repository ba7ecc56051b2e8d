# kind: memory (MAP_SHARED anonymous memory, written)
# variants: rw ro
# refusal-names: shared anonymous
from _probe import *
N = 8 * PAGE
a = mmap(N, flags=MAP_SHARED | MAP_ANONYMOUS)
fill(a, N, 66)
if VARIANT == 'ro':
    libc.mprotect(a, N, PROT_READ)


def check():
    perms = mapping(a)[0]
    expect(perms == ('rw-s' if VARIANT == 'rw' else 'r--s'), f'perms {perms}')
    verify(a, N, 66, 'shared anonymous')
