# kind: signals (the blocked-signal mask of the main thread)
# variants: usr1 several rt
# refusal-names: mask
from _probe import *
import signal
SIGS = {'usr1': [signal.SIGUSR1], 'several': [signal.SIGUSR1, signal.SIGHUP, signal.SIGCHLD], 'rt': [signal.SIGRTMIN + 5]}[VARIANT]
signal.pthread_sigmask(signal.SIG_BLOCK, SIGS)
WANT = signal.pthread_sigmask(signal.SIG_BLOCK, [])


def check():
    got = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    expect(got == WANT, f'mask {sorted(got)}, want {sorted(WANT)}')
