# kind: signals (kernel-level dispositions: SIG_IGN, SA_RESTART/SA_ONSTACK/SA_NODEFER flags, sa_mask)
# variants: ignore flags mask
# refusal-names: signal
from _probe import *
import signal


class Sigaction(ctypes.Structure):
    _fields_ = [('handler', ctypes.c_void_p), ('flags', ctypes.c_ulong), ('restorer', ctypes.c_void_p), ('mask', ctypes.c_uint64)]


def get(sig):
    sa = Sigaction()
    check_errno(libc.syscall(13, sig, None, ctypes.byref(sa), 8), 'rt_sigaction')
    return sa.handler or 0, sa.flags, sa.mask


if VARIANT == 'ignore':
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
else:
    signal.signal(signal.SIGUSR2, lambda s, f: None)
    h, fl, m = get(signal.SIGUSR2)
    old = Sigaction(h, fl | (0x08000000 | 0x40000000 if VARIANT == 'flags' else 0), 0, m | (1 << 9 if VARIANT == 'mask' else 0))
    old.restorer = None
    # keep glibc's restorer: read it back through a second query
    cur = Sigaction()
    libc.syscall(13, signal.SIGUSR2, None, ctypes.byref(cur), 8)
    old.restorer = cur.restorer
    check_errno(libc.syscall(13, signal.SIGUSR2, ctypes.byref(old), None, 8), 'rt_sigaction set')
WANT = get(signal.SIGUSR2)


def check():
    got = get(signal.SIGUSR2)
    expect(got == WANT, f'disposition {got}, want {WANT}')
    if VARIANT == 'ignore':
        os.kill(os.getpid(), signal.SIGUSR2)  # would kill the process if not ignored
