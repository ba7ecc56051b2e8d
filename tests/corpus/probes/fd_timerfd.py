# kind: descriptors (timerfd: armed far in the future, disarmed, periodic)
# variants: armed disarmed periodic
# refusal-names: timerfd|anon_inode:[timerfd]
from _probe import *
import _timerfd as tfd
fd = tfd.create(tfd.TFD_NONBLOCK)
if VARIANT == 'armed':
    tfd.settime(fd, 3600)
elif VARIANT == 'periodic':
    tfd.settime(fd, 0.05, 0.05)


def check():
    expect(fd_target(fd) == 'anon_inode:[timerfd]', fd_target(fd))
    left, interval = tfd.gettime(fd)
    if VARIANT == 'armed':
        expect(0 < left <= 3600 and interval == 0, f'timer has {left} s left, interval {interval}')
    elif VARIANT == 'disarmed':
        expect(left == 0 and interval == 0, f'disarmed timer has {left}/{interval}')
    else:
        expect(abs(interval - 0.05) < 1e-9, f'interval {interval}')
        os.set_blocking(fd, True)
        expect(os.read(fd, 8) and True, 'periodic timer does not expire')
