# kind: process attributes (cwd, environment, nice, CPU affinity, timer slack, comm, oom_score_adj, THP-disable, child subreaper, pdeathsig)
# variants: cwd environ nice affinity timerslack comm oomadj thpdisable subreaper
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
    }[VARIANT]()


WANT = state()


def check():
    expect(state() == WANT, f'{VARIANT}: {state()}, want {WANT}')
