# kind: threads (per-thread state: a thread's own signal mask, name, altstack)
# variants: mask name altstack
# refusal-names: thread
from _probe import *
import threading, signal


class StackT(ctypes.Structure):
    _fields_ = [('sp', ctypes.c_void_p), ('flags', ctypes.c_int), ('size', ctypes.c_size_t)]


ready = threading.Event()
go = threading.Event()
seen = {}
stack = mmap(64 * 1024)


def body():
    if VARIANT == 'mask':
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH, signal.SIGRTMIN + 2])
        want = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    elif VARIANT == 'name':
        libc.prctl(15, b'probe-worker')
        want = 'probe-worker'
    else:
        libc.sigaltstack(ctypes.byref(StackT(stack, 0, 64 * 1024)), None)
        want = (stack, 64 * 1024)
    ready.set()
    go.wait()
    if VARIANT == 'mask':
        seen['got'] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    elif VARIANT == 'name':
        seen['got'] = open(f'/proc/self/task/{threading.get_native_id()}/comm').read().strip()
    else:
        cur = StackT()
        libc.sigaltstack(None, ctypes.byref(cur))
        seen['got'] = (cur.sp, cur.size)
    seen['want'] = want


t = threading.Thread(target=body, daemon=True)
t.start()
ready.wait()


def check():
    go.set()
    t.join(30)
    expect(seen.get('got') == seen.get('want'), f'thread state {seen.get("got")}, want {seen.get("want")}')
