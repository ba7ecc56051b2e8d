# kind: signals (an alternate signal stack of the main thread)
# variants: main
# refusal-names: altstack|sigaltstack
from _probe import *


class StackT(ctypes.Structure):
    _fields_ = [('sp', ctypes.c_void_p), ('flags', ctypes.c_int), ('size', ctypes.c_size_t)]


N = 64 * 1024
stack = mmap(N)
check_errno(libc.sigaltstack(ctypes.byref(StackT(stack, 0, N)), None), 'sigaltstack')


def check():
    cur = StackT()
    check_errno(libc.sigaltstack(None, ctypes.byref(cur)), 'sigaltstack')
    expect((cur.sp, cur.flags, cur.size) == (stack, 0, N), f'altstack {cur.sp:#x} {cur.flags} {cur.size}')
