# kind: signals (blocked signals left pending: process-wide, thread-directed, queued with values)
# variants: process thread queued
# refusal-names: pending
from _probe import *
import signal
import threading

SI_USER, SI_QUEUE = 0, -1
RT = signal.SIGRTMIN + 2
VALUES = (7, 8, 9)

signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, RT])
if VARIANT == 'process':
    os.kill(os.getpid(), signal.SIGUSR1)
elif VARIANT == 'thread':
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
else:
    # Three instances of one realtime signal, each with its value: all queued, in order.
    for v in VALUES:
        check_errno(libc.sigqueue(os.getpid(), RT, ctypes.c_void_p(v)), 'sigqueue')


def pending_masks():
    """(the thread's own pending set, the process's), from /proc."""
    def field(path, name):
        for line in open(path):
            if line.startswith(name + ':'):
                return int(line.split()[1], 16)
    return field(f'/proc/self/task/{threading.get_native_id()}/status', 'SigPnd'), field('/proc/self/status', 'ShdPnd')


def take(sig):
    """Dequeue one `sig` (blocked): (si_code, si_pid, si_value) from the raw siginfo_t."""
    mask = (ctypes.c_ulong * 16)()
    libc.sigemptyset(mask)
    libc.sigaddset(mask, sig)
    info = ctypes.create_string_buffer(128)
    timeout = ctypes.create_string_buffer(struct.pack('qq', 0, 0))
    got = libc.sigtimedwait(mask, info, timeout)
    expect(got == sig, f'signal {sig} was not pending (sigtimedwait returned {got})')
    code, = struct.unpack_from('i', info.raw, 8)
    pid, = struct.unpack_from('i', info.raw, 16)
    value = struct.unpack_from('q', info.raw, 24)[0]
    return code, pid, value


def check():
    own, shared = pending_masks()
    if VARIANT in ('process', 'thread'):
        bit = 1 << (signal.SIGUSR1 - 1)
        if VARIANT == 'process':
            expect(shared & bit and not own & bit, f'SIGUSR1 not pending for the process (thread {own:#x}, process {shared:#x})')
        else:
            expect(own & bit and not shared & bit, f'SIGUSR1 not pending for the thread (thread {own:#x}, process {shared:#x})')
        code, pid, _ = take(signal.SIGUSR1)
        # (tgkill's si_code is SI_TKILL or SI_USER depending on the kernel: not checked.)
        expect(VARIANT == 'thread' or code == SI_USER, f'si_code {code}, sent with {SI_USER}')
        expect(pid == os.getpid(), f'si_pid {pid}, sent by {os.getpid()}')
    else:
        expect(shared & (1 << (RT - 1)), f'the queued signal is not pending (process {shared:#x})')
        got = [take(RT) for _ in VALUES]
        expect([g[0] for g in got] == [SI_QUEUE] * 3, f'si_code {[g[0] for g in got]}')
        expect([g[2] for g in got] == list(VALUES), f'values {[g[2] for g in got]}, queued {list(VALUES)}')
    expect(not pending_masks()[1] and not pending_masks()[0], 'signals still pending after taking them')
