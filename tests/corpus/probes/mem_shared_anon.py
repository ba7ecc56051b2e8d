# kind: memory (MAP_SHARED anonymous memory, written)
# variants: rw ro dontneed
# refusal-names: shared anonymous
from _probe import *
N = 8 * PAGE
a = mmap(N, flags=MAP_SHARED | MAP_ANONYMOUS)
fill(a, N, 66)
if VARIANT == 'ro':
    libc.mprotect(a, N, PROT_READ)
if VARIANT == 'dontneed':
    # Unmapped from this process, still held by the shared object: reads see it again.
    check_errno(libc.madvise(ctypes.c_void_p(a), 2 * PAGE, 4), 'madvise(MADV_DONTNEED)')


def check():
    perms = mapping(a)[0]
    expect(perms == ('r--s' if VARIANT == 'ro' else 'rw-s'), f'perms {perms}')
    verify(a, N, 66, 'shared anonymous')
