# kind: process trees (children, grandchildren, zombies, a reaped child, a stopped child)
# variants: child grandchild zombie zombies reaped stopped
# refusal-names: process
from _probe import *
import signal, time
if VARIANT == 'reaped':
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    STATUS = os.waitpid(pid, 0)[1]
elif VARIANT == 'zombies':
    # Two zombies under a SIGCHLD handler: the restore recreates them without
    # running the handler again.
    CALLS = [0]
    signal.signal(signal.SIGCHLD, lambda s, f: CALLS.__setitem__(0, CALLS[0] + 1))
    KIDS = {}
    for code in (4, 5):
        k = os.fork()
        if k == 0:
            os._exit(code)
        KIDS[k] = code
    deadline = time.time() + 5
    while CALLS[0] == 0 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    AT_INIT = CALLS[0]
else:
    pid = os.fork()
    if pid == 0:
        if VARIANT == 'grandchild':
            if os.fork() == 0:
                time.sleep(3600)
            os.wait()
        if VARIANT == 'zombie':
            os._exit(3)
        time.sleep(3600)
        os._exit(0)
    if VARIANT == 'stopped':
        os.kill(pid, signal.SIGSTOP)
        os.waitpid(pid, os.WUNTRACED)
    time.sleep(0.2)


def check():
    if VARIANT == 'zombies':
        time.sleep(0.05)
        expect(CALLS[0] == AT_INIT, f'the SIGCHLD handler ran {CALLS[0] - AT_INIT} more times')
        for k, code in KIDS.items():
            expect(os.getpgid(k) == os.getpgid(0), f'zombie {k} in another process group')
            p, st = os.waitpid(k, os.WNOHANG)
            expect(p == k and os.WIFEXITED(st) and os.WEXITSTATUS(st) == code, f'zombie {k}: {p} {st}')
        try:
            os.waitpid(-1, os.WNOHANG)
            expect(False, 'a child left after both zombies were reaped')
        except ChildProcessError:
            pass
        return
    if VARIANT == 'reaped':
        expect(os.WEXITSTATUS(STATUS) == 7, 'status')
        pid2 = os.fork()
        if pid2 == 0:
            os._exit(0)
        expect(os.waitpid(pid2, 0)[0] == pid2, 'cannot fork and reap after the restore')
        return
    expect(os.path.exists(f'/proc/{pid}'), f'child {pid} is gone')
    if VARIANT == 'zombie':
        p, st = os.waitpid(pid, os.WNOHANG)
        expect(p == pid and os.WEXITSTATUS(st) == 3, f'zombie status {p} {st}')
    else:
        os.kill(pid, signal.SIGKILL)
        expect(os.waitpid(pid, 0)[0] == pid, 'child not ours')
