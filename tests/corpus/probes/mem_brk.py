# kind: memory (the program break moved by sbrk, the new heap written)
# variants: grow
# refusal-names: brk
from _probe import *
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]
N = 64 * PAGE
start = libc.sbrk(0)
check_errno(libc.sbrk(N), 'sbrk')
fill(start, N, 121)
END = libc.sbrk(0)


def check():
    expect(libc.sbrk(0) == END, f'break {libc.sbrk(0):#x}, want {END:#x}')
    verify(start, N, 121, 'sbrk heap')
