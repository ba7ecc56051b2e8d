# kind: process trees (children, grandchildren, zombies, a reaped child, a stopped child)
# variants: child grandchild zombie reaped stopped
# refusal-names: process
from _probe import *
import signal, time
if VARIANT == 'reaped':
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    STATUS = os.waitpid(pid, 0)[1]
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
