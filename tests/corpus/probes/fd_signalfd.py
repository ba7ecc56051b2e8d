# kind: descriptors (signalfd for a blocked signal, delivered through it after the restore)
# variants: usr1 rt
# refusal-names: signalfd
from _probe import *
import signal
SIG = signal.SIGUSR1 if VARIANT == 'usr1' else signal.SIGRTMIN + 3
signal.pthread_sigmask(signal.SIG_BLOCK, [SIG])
mask = (ctypes.c_uint64 * 16)(1 << (SIG - 1))  # glibc sigset_t; the kernel reads 8 bytes
fd = check_errno(libc.signalfd(-1, mask, os.O_NONBLOCK), "signalfd")


def check():
    expect(fd_target(fd) == 'anon_inode:[signalfd]', fd_target(fd))
    os.kill(os.getpid(), SIG)
    info = os.read(fd, 128)
    expect(struct.unpack_from('<I', info)[0] == SIG, f'read signal {struct.unpack_from("<I", info)[0]}')
