# kind: signals (interval timers: ITIMER_REAL / VIRTUAL / PROF armed far ahead, alarm())
# variants: real virtual prof alarm
# refusal-names: itimer|timer|alarm
from _probe import *
import signal
W = {'real': signal.ITIMER_REAL, 'virtual': signal.ITIMER_VIRTUAL, 'prof': signal.ITIMER_PROF, 'alarm': signal.ITIMER_REAL}[VARIANT]
if VARIANT == 'alarm':
    signal.alarm(3600)
else:
    signal.setitimer(W, 3600, 60)


def check():
    left, interval = signal.getitimer(W)
    # The kernel rounds CPU-time timers (VIRTUAL, PROF) up to a scheduler tick: a
    # cold boot reads 3600.004 s.
    expect(0 < left <= 3600.1, f'{VARIANT} timer has {left} s left (not armed)')
    expect(interval == (0 if VARIANT == 'alarm' else 60), f'interval {interval}')
