# kind: memory (transparent huge pages: MADV_HUGEPAGE / MADV_NOHUGEPAGE on aligned anonymous memory)
# variants: hugepage nohugepage
# refusal-names: huge
from _probe import *
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
HP = 2 << 20
raw = mmap(3 * HP)
a = (raw + HP - 1) // HP * HP
libc.madvise(a, 2 * HP, MADV_HUGEPAGE if VARIANT == 'hugepage' else MADV_NOHUGEPAGE)
fill(a, 2 * HP, 55)
FLAG = 'hg' if VARIANT == 'hugepage' else 'nh'


def check():
    flags = mapping(a)[2]
    expect(FLAG in flags, f'VmFlags {flags} lack {FLAG}')
    verify(a, 2 * HP, 55, 'THP region')
