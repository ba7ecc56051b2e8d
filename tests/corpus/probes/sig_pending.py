# kind: signals (a blocked signal left pending: process-wide or thread-directed)
# variants: process thread
# refusal-names: pending
from _probe import *
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
if VARIANT == 'process':
    os.kill(os.getpid(), signal.SIGUSR1)
else:
    signal.pthread_kill(__import__('threading').main_thread().ident, signal.SIGUSR1)


def check():
    expect(signal.SIGUSR1 in signal.sigpending(), 'pending signal lost')
