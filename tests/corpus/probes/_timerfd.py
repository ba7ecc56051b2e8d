"""timerfd through ctypes (os.timerfd_* arrived in Python 3.13)."""
import ctypes
import os

from _probe import libc, check_errno

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK


class Itimerspec(ctypes.Structure):
    _fields_ = [('isec', ctypes.c_long), ('insec', ctypes.c_long), ('vsec', ctypes.c_long), ('vnsec', ctypes.c_long)]


def create(flags=0):
    return check_errno(libc.timerfd_create(CLOCK_MONOTONIC, flags), 'timerfd_create')


def settime(fd, initial, interval=0.0):
    sec = lambda x: (int(x), int(round((x - int(x)) * 1e9)))
    i, v = sec(interval), sec(initial)
    check_errno(libc.timerfd_settime(fd, 0, ctypes.byref(Itimerspec(*i, *v)), None), 'timerfd_settime')


def gettime(fd):
    cur = Itimerspec()
    check_errno(libc.timerfd_gettime(fd, ctypes.byref(cur)), 'timerfd_gettime')
    return cur.vsec + cur.vnsec / 1e9, cur.isec + cur.insec / 1e9
