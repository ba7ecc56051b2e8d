# kind: memory (a mapping at a fixed low and a fixed high address)
# variants: low high
# refusal-names: address
from _probe import *
ADDR = 0x10000000 if VARIANT == 'low' else 0x7e0000000000
N = 4 * PAGE
got = mmap(N, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, addr=ADDR)
assert got == ADDR
fill(ADDR, N, 131)


def check():
    verify(ADDR, N, 131, 'fixed mapping')
