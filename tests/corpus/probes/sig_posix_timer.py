# kind: signals (POSIX timers: timer_create on CLOCK_MONOTONIC / CLOCK_REALTIME, armed)
# variants: monotonic realtime
# refusal-names: posix timer
from _probe import *
import time


class Sigevent(ctypes.Structure):
    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int), ('notify', ctypes.c_int), ('pad', ctypes.c_byte * 48)]


class Itimerspec(ctypes.Structure):
    _fields_ = [('isec', ctypes.c_long), ('insec', ctypes.c_long), ('vsec', ctypes.c_long), ('vnsec', ctypes.c_long)]


CLK = time.CLOCK_MONOTONIC if VARIANT == 'monotonic' else time.CLOCK_REALTIME
tid = ctypes.c_int()
check_errno(libc.syscall(222, CLK, ctypes.byref(Sigevent(None, 10, 0)), ctypes.byref(tid)), 'timer_create')
check_errno(libc.syscall(223, tid, 0, ctypes.byref(Itimerspec(0, 0, 3600, 0)), None), 'timer_settime')


def check():
    cur = Itimerspec()
    check_errno(libc.syscall(224, tid, ctypes.byref(cur)), 'timer_gettime')
    expect(0 < cur.vsec <= 3600, f'timer has {cur.vsec} s left')
