# kind: memory (mlock'd pages, within RLIMIT_MEMLOCK)
# variants: mlock
# refusal-names: mlock|locked
from _probe import *
N = 4 * PAGE
a = mmap(N)
fill(a, N, 101)
check_errno(libc.mlock(ctypes.c_void_p(a), N), 'mlock')


def check():
    expect('lo' in mapping(a)[2], f'VmFlags {mapping(a)[2]} lack lo (mlock lost)')
    verify(a, N, 101, 'locked region')
