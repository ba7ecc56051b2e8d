# kind: memory (a PROT_NONE guard page below a thread-stack-like region, as pthreads makes)
# variants: 1page 16pages
# refusal-names: guard
from _probe import *
G = (1 if VARIANT == '1page' else 16) * PAGE
N = 32 * PAGE
a = mmap(G + N)
libc.mprotect(a, G, PROT_NONE)
fill(a + G, N, 33)


def check():
    perms, _, _, (lo, hi) = mapping(a)
    expect(perms == '---p' and lo == a and hi == a + G, f'guard is {perms} {lo:#x}-{hi:#x}')
    verify(a + G, N, 33, 'guarded region')
