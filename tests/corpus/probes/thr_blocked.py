# kind: threads (a thread blocked at capture in: futex (Event.wait / Lock), nanosleep, read on a pipe, poll, select, epoll_wait, recv on a socketpair, sigwait, Condition with timeout)
# variants: event lock sleep read poll select epoll recv sigwait condtimeout
# refusal-names: thread|socket
from _probe import *
import threading, select, signal, socket, time
r, w = os.pipe()
ev = threading.Event()
lock = threading.Lock()
lock.acquire()
cond = threading.Condition()
got = []
a, b = socket.socketpair() if VARIANT == 'recv' else (None, None)
ep = select.epoll()
ep.register(r, select.EPOLLIN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])


def body():
    if VARIANT == 'event':
        ev.wait()
    elif VARIANT == 'lock':
        lock.acquire()
    elif VARIANT == 'sleep':
        time.sleep(0.5)
    elif VARIANT == 'read':
        os.read(r, 1)
    elif VARIANT == 'poll':
        p = select.poll()
        p.register(r, select.POLLIN)
        p.poll()
    elif VARIANT == 'select':
        select.select([r], [], [])
    elif VARIANT == 'epoll':
        ep.poll()
    elif VARIANT == 'recv':
        b.recv(1)
    elif VARIANT == 'sigwait':
        signal.sigwait([signal.SIGUSR2])
    elif VARIANT == 'condtimeout':
        with cond:
            cond.wait(0.5)
    got.append(VARIANT)


t = threading.Thread(target=body, daemon=True)
t.start()
time.sleep(0.2)  # let it block before the snapshot


def check():
    expect(t.is_alive() or VARIANT in ('sleep', 'condtimeout'), 'the blocked thread is gone')
    ev.set()
    lock.release()
    os.write(w, b'x')
    if a:
        a.send(b'x')
    if VARIANT == 'sigwait':
        signal.pthread_kill(t.ident, signal.SIGUSR2)
    t.join(30)
    expect(got == [VARIANT], f'thread did not complete its {VARIANT} after the restore (got {got})')
