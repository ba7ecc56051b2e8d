# kind: memory (mremap'd anonymous memory: grown in place, shrunk, moved)
# variants: grow shrink move
# refusal-names: mremap
from _probe import *
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
N = 16 * PAGE
a = mmap(N)
fill(a, N, 11)
if VARIANT == 'grow':
    addr, size = check_errno(libc.mremap(a, N, 2 * N, MREMAP_MAYMOVE, None), 'mremap'), 2 * N
    fill(addr, 2 * N, 11)  # the whole grown mapping
elif VARIANT == 'shrink':
    addr, size = check_errno(libc.mremap(a, N, N // 2, 0, None), 'mremap'), N // 2
else:
    hole = mmap(4 * N, PROT_NONE)
    target = hole + 2 * N
    addr = check_errno(libc.mremap(a, N, N, MREMAP_MAYMOVE | MREMAP_FIXED, ctypes.c_void_p(target)), 'mremap')
    size = N
    assert addr == target


def check():
    perms, _, _, (lo, hi) = mapping(addr)
    expect(perms.startswith('rw'), f'perms {perms}')
    expect(lo <= addr and hi >= addr + size, f'vma {lo:#x}-{hi:#x} does not cover {addr:#x}+{size:#x}')
    verify(addr, size, 11, 'mremapped')
    if VARIANT == 'shrink':
        p = mapping(addr + size - 1)
        expect(p[3][1] == addr + size or mapping_end_ok(addr + size), 'shrunk tail still mapped')


def mapping_end_ok(x):
    try:
        mapping(x)
        return False
    except Failure:
        return True
