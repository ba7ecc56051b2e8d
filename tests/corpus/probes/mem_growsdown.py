# kind: memory (a MAP_GROWSDOWN stack-like mapping, partly written)
# variants: small large
# refusal-names: growsdown
from _probe import *
N = (4 if VARIANT == 'small' else 256) * PAGE
a = mmap(N, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN)
fill(a + N // 2, N // 2, 44)


def check():
    perms, _, flags, _ = mapping(a + N - 1)
    expect('gd' in flags, f'VmFlags {flags} lack gd')
    verify(a + N // 2, N // 2, 44, 'growsdown region')
