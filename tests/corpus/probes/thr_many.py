# kind: threads (many threads parked on one condition, each with its own name and state)
# variants: 2 16 64
# refusal-names: thread
from _probe import *
import threading
N = int(VARIANT)
cond = threading.Condition()
go = [False]
done = []


def body(i):
    with cond:
        while not go[0]:
            cond.wait()
    done.append(i)


ts = [threading.Thread(target=body, args=(i,), name=f'w{i}', daemon=True) for i in range(N)]
for t in ts:
    t.start()
libc.prctl(15, b'probe-main')  # PR_SET_NAME


def check():
    names = {open(f'/proc/self/task/{t.native_id}/comm').read().strip() for t in ts}
    expect(len(os.listdir('/proc/self/task')) >= N + 1, f'{len(os.listdir("/proc/self/task"))} tasks')
    with cond:
        go[0] = True
        cond.notify_all()
    for t in ts:
        t.join(30)
    expect(sorted(done) == list(range(N)), f'{len(done)} of {N} threads finished')
    expect(open('/proc/self/comm').read().strip() == 'probe-main', 'main thread name lost')
