# kind: process attributes (cwd, environment, nice, CPU affinity, timer slack, comm, oom_score_adj, THP-disable, child subreaper, pdeathsig, a seccomp filter of its own, scheduling policies)
# variants: cwd environ nice affinity timerslack comm oomadj thpdisable subreaper seccomp sched
# refusal-names: process
from _probe import *
if VARIANT == 'cwd':
    os.makedirs('/tmp/wd', exist_ok=True)
    os.chdir('/tmp/wd')
elif VARIANT == 'environ':
    os.environ['PROBE_SET_AT_INIT'] = 'yes'
elif VARIANT == 'nice':
    os.nice(5)
elif VARIANT == 'affinity':
    os.sched_setaffinity(0, {0})
elif VARIANT == 'timerslack':
    libc.prctl(29, 123456, 0, 0, 0)
elif VARIANT == 'comm':
    libc.prctl(15, b'renamed', 0, 0, 0)
elif VARIANT == 'oomadj':
    open('/proc/self/oom_score_adj', 'w').write('500')
elif VARIANT == 'thpdisable':
    libc.prctl(41, 1, 0, 0, 0)
elif VARIANT == 'subreaper':
    libc.prctl(36, 1, 0, 0, 0)
elif VARIANT == 'sched':
    # The process batch, a thread of it idle.
    import threading
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    TID = []
    started = threading.Event()
    def idle_thread():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        TID.append(threading.get_native_id())
        started.set()
        threading.Event().wait()
    threading.Thread(target=idle_thread, daemon=True).start()
    started.wait(5)
elif VARIANT == 'seccomp':
    # A filter of its own that denies getcpu(2) with EPERM (refused by name: a
    # restore would drop it). struct sock_filter {u16 code; u8 jt, jf; u32 k}.
    SYS_GETCPU = 309
    prog = [(0x20, 0, 0, 0),                  # ld [nr]
            (0x15, 0, 1, SYS_GETCPU),         # jeq getcpu ? next : allow
            (0x06, 0, 0, 0x00050000 | 1),     # ret ERRNO(EPERM)
            (0x06, 0, 0, 0x7fff0000)]         # ret ALLOW
    raw = b''.join(struct.pack('<HBBI', *f) for f in prog)
    buf = ctypes.create_string_buffer(raw)
    fprog = struct.pack('<HxxxxxxQ', len(prog), ctypes.addressof(buf))
    check_errno(libc.prctl(38, 1, 0, 0, 0), 'PR_SET_NO_NEW_PRIVS')
    check_errno(libc.prctl(22, 2, ctypes.create_string_buffer(fprog), 0, 0), 'PR_SET_SECCOMP')


def state():
    v = ctypes.c_int()
    return {
        'cwd': os.getcwd,
        'environ': lambda: (os.environ.get('PROBE_SET_AT_INIT'), open('/proc/self/environ', 'rb').read().count(b'PROBE_SET_AT_INIT=yes')),
        'nice': lambda: os.getpriority(os.PRIO_PROCESS, 0),
        'affinity': lambda: sorted(os.sched_getaffinity(0)),
        'timerslack': lambda: libc.prctl(30, 0, 0, 0, 0),
        'comm': lambda: open('/proc/self/comm').read().strip(),
        'oomadj': lambda: open('/proc/self/oom_score_adj').read().strip(),
        'thpdisable': lambda: libc.prctl(42, 0, 0, 0, 0),
        'subreaper': lambda: (libc.prctl(37, ctypes.byref(v), 0, 0, 0), v.value)[1],
        'seccomp': lambda: (libc.syscall(309, 0, 0, 0), ctypes.get_errno()),
        'sched': lambda: (os.sched_getscheduler(0), os.sched_getscheduler(TID[0])),
    }[VARIANT]()


WANT = state()


def check():
    expect(state() == WANT, f'{VARIANT}: {state()}, want {WANT}')
