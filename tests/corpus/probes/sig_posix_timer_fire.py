# kind: signals (POSIX timers after a restore: they fire, periodically, at a chosen thread, and keep their ids)
# variants: fire interval thread ids
# refusal-names: posix timer
from _probe import *
import signal
import threading


class Sigevent(ctypes.Structure):
    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int), ('notify', ctypes.c_int), ('tid', ctypes.c_int), ('pad', ctypes.c_byte * 44)]


class Itimerspec(ctypes.Structure):
    _fields_ = [('isec', ctypes.c_long), ('insec', ctypes.c_long), ('vsec', ctypes.c_long), ('vnsec', ctypes.c_long)]


SIG = signal.SIGRTMIN + 1
SI_TIMER, SIGEV_SIGNAL, SIGEV_THREAD_ID = -2, 0, 4
signal.pthread_sigmask(signal.SIG_BLOCK, [SIG])


def create(notify=SIGEV_SIGNAL, tid=0):
    t = ctypes.c_int()
    check_errno(libc.syscall(222, 1, ctypes.byref(Sigevent(None, SIG, notify, tid)), ctypes.byref(t)), 'timer_create')
    return t.value


def arm(t, value_ms, interval_ms=0):
    spec = Itimerspec(interval_ms // 1000, interval_ms % 1000 * 1000000, value_ms // 1000, value_ms % 1000 * 1000000)
    check_errno(libc.syscall(223, t, 0, ctypes.byref(spec), None), 'timer_settime')


got = []
if VARIANT == 'fire':
    arm(create(), 1500)
elif VARIANT == 'interval':
    arm(create(), 1500, 200)
elif VARIANT == 'thread':
    ready = threading.Event()

    def waiter():
        got.append(threading.get_native_id())
        ready.set()
        info = signal.sigtimedwait([SIG], 30)
        got.append(info and info.si_code)

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    ready.wait()
    arm(create(SIGEV_THREAD_ID, got[0]), 1500)
elif VARIANT == 'ids':
    ids = [create() for _ in range(3)]
    check_errno(libc.syscall(226, ids[1]), 'timer_delete')
    arm(ids[0], 3600 * 1000)
    arm(ids[2], 1800 * 1000)


def left(t):
    cur = Itimerspec()
    r = libc.syscall(224, t, ctypes.byref(cur))
    return cur.vsec if r == 0 else None


def check():
    if VARIANT == 'fire':
        info = signal.sigtimedwait([SIG], 10)
        expect(info is not None and info.si_code == SI_TIMER, f'the timer did not fire after the restore: {info}')
    elif VARIANT == 'interval':
        for i in range(3):
            info = signal.sigtimedwait([SIG], 10)
            expect(info is not None and info.si_code == SI_TIMER, f'firing {i + 1} of a periodic timer missing: {info}')
    elif VARIANT == 'thread':
        th.join(10)
        expect(got[1:] == [SI_TIMER], f'the timer did not reach its thread: {got}')
    elif VARIANT == 'ids':
        a, b, c = left(ids[0]), left(ids[1]), left(ids[2])
        expect(a is not None and 1800 < a <= 3600 and c is not None and 0 < c <= 1800 and b is None,
               f'timer ids not kept: {ids} -> {a} {b} {c}')
