# kind: clocks (timers armed at init fire after the restore: a 1 s ITIMER_REAL, a 1 s timerfd, a sleeping thread)
# variants: itimer timerfd sleep
# refusal-names: timer
from _probe import *
import signal, threading, time, select
fired = []
if VARIANT == 'itimer':
    signal.signal(signal.SIGALRM, lambda s, f: fired.append(s))
    signal.setitimer(signal.ITIMER_REAL, 1.0)
elif VARIANT == 'timerfd':
    import _timerfd as tfd
    fd = tfd.create()
    tfd.settime(fd, 1.0)
else:
    t = threading.Thread(target=lambda: (time.sleep(1.0), fired.append(1)), daemon=True)
    t.start()


def check():
    # Wait (up to 30 s: no timing assertion) for the timer armed at init.
    if VARIANT == 'timerfd':
        r, _, _ = select.select([fd], [], [], 30)
        expect(r == [fd] and struct.unpack('<Q', os.read(fd, 8))[0] >= 1, 'timerfd never fired')
        return
    deadline = time.monotonic() + 30
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    expect(fired, f'the {VARIANT} timer armed at init never fired')
