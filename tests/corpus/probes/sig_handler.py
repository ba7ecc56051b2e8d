# kind: signals (a Python-level handler installed at init runs after the restore)
# variants: usr1 usr2 term rtmin hup
# refusal-names: signal
from _probe import *
import signal
SIG = {'usr1': signal.SIGUSR1, 'usr2': signal.SIGUSR2, 'term': signal.SIGTERM, 'rtmin': signal.SIGRTMIN, 'hup': signal.SIGHUP}[VARIANT]
hits = []
signal.signal(SIG, lambda s, f: hits.append(s))


def check():
    os.kill(os.getpid(), SIG)
    expect(hits == [SIG], f'handler saw {hits}')
