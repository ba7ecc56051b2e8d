# kind: process trees (process group and session: setpgid, setsid)
# variants: pgid sid
# refusal-names: session|group
from _probe import *
if VARIANT == 'pgid':
    os.setpgid(0, 0)
else:
    os.setsid()
WANT = (os.getpid(), os.getpgid(0), os.getsid(0))


def check():
    got = (os.getpid(), os.getpgid(0), os.getsid(0))
    expect(got == WANT, f'(pid, pgid, sid) {got}, want {WANT}')
