# kind: descriptors (descriptors in flight over a unix socket: sent, not yet received)
# variants: file two tmp held pipe socketpair nested eventfd orphan
# refusal-names: socket
from _probe import *
import socket
a, b = socket.socketpair()
if VARIANT == 'file':
    fd = os.open('/var/task/handler.py', os.O_RDONLY)
    socket.send_fds(a, [b'fd'], [fd])
    os.close(fd)
elif VARIANT == 'two':
    # Two messages, the second passing two descriptors, the first's offset moved.
    f1 = os.open('/var/task/handler.py', os.O_RDONLY)
    os.lseek(f1, 3, os.SEEK_SET)
    f2 = os.open('/var/task', os.O_RDONLY | os.O_DIRECTORY)
    socket.send_fds(a, [b'one'], [f1])
    socket.send_fds(a, [b'two'], [f1, f2])
    os.close(f1)
    os.close(f2)
elif VARIANT == 'tmp':
    with open('/tmp/passed', 'w') as f:
        f.write('passed')
    fd = os.open('/tmp/passed', os.O_RDWR | os.O_APPEND)
    socket.send_fds(a, [b'tmp'], [fd])
    os.close(fd)
elif VARIANT == 'held':
    # Sent and still held: one open file description, so one offset.
    held = os.open('/var/task/handler.py', os.O_RDONLY)
    socket.send_fds(a, [b'held'], [held])
elif VARIANT == 'pipe':
    # A pipe's read end in flight, with bytes in the pipe; the process keeps the
    # write end.
    r, w = os.pipe()
    socket.send_fds(a, [b'pipe'], [r])
    os.close(r)
    os.write(w, b'queued')
elif VARIANT == 'socketpair':
    # One end of another socketpair in flight, a message waiting on it; the process
    # keeps the other end.
    c, d = socket.socketpair()
    socket.send_fds(a, [b'socketpair'], [c.fileno()])
    c.close()
    d.send(b'to c')
elif VARIANT == 'nested':
    # A socketpair end in flight whose own queued message passes a file.
    c, d = socket.socketpair()
    f = os.open('/var/task/handler.py', os.O_RDONLY)
    socket.send_fds(d, [b'inner'], [f])
    os.close(f)
    socket.send_fds(a, [b'nested'], [c.fileno()])
    c.close()
elif VARIANT == 'eventfd':
    efd = os.eventfd(5, os.EFD_NONBLOCK)
    socket.send_fds(a, [b'eventfd'], [efd])
    os.close(efd)
elif VARIANT == 'orphan':
    # A pipe's read end in flight, with a byte in the pipe, whose writer is closed.
    r, w = os.pipe()
    os.write(w, b'x')
    socket.send_fds(a, [b'orphan'], [r])
    os.close(r)
    os.close(w)

def recv(n):
    b.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(b, 100, n)
    return msg, fds


def check():
    if VARIANT == 'file':
        msg, fds = recv(1)
        expect(msg == b'fd' and len(fds) == 1, f'received {msg!r} {fds}')
        expect(fd_target(fds[0]) == '/var/task/handler.py', fd_target(fds[0]))
    elif VARIANT == 'two':
        msg, fds = recv(2)
        expect(msg == b'one' and len(fds) == 1, f'first message {msg!r} {fds}')
        expect(os.lseek(fds[0], 0, os.SEEK_CUR) == 3, 'the first descriptor lost its offset')
        msg2, fds2 = recv(2)
        expect(msg2 == b'two' and len(fds2) == 2, f'second message {msg2!r} {fds2}')
        expect(fd_target(fds2[1]) == '/var/task', fd_target(fds2[1]))
        # One open file description sent twice: one offset.
        os.lseek(fds[0], 5, os.SEEK_SET)
        expect(os.lseek(fds2[0], 0, os.SEEK_CUR) == 5, 'the same file sent twice became two')
    elif VARIANT == 'tmp':
        msg, fds = recv(1)
        expect(msg == b'tmp' and len(fds) == 1, f'received {msg!r} {fds}')
        os.write(fds[0], b'+')
        expect(open('/tmp/passed').read() == 'passed+', 'the passed /tmp file is not the instance\'s')
    else:
        msg, fds = recv(1)
        expect(msg == VARIANT.encode() and len(fds) == 1, f'received {msg!r} {fds}')
        got = fds[0]
        if VARIANT == 'held':
            os.lseek(got, 7, os.SEEK_SET)
            expect(os.lseek(held, 0, os.SEEK_CUR) == 7, 'the held and the passed descriptor became two open files')
        elif VARIANT == 'pipe':
            expect(os.read(got, 100) == b'queued', 'the bytes in the passed pipe are lost')
            os.write(w, b'more')
            expect(os.read(got, 100) == b'more', 'the passed read end is not the held write end\'s pipe')
            os.close(w)
            expect(os.read(got, 100) == b'', 'another write end is open')
        elif VARIANT == 'socketpair':
            c2 = socket.socket(fileno=got)
            c2.settimeout(5)
            expect(c2.recv(100) == b'to c', 'the message queued on the passed end is lost')
            c2.send(b'back')
            d.settimeout(5)
            expect(d.recv(100) == b'back', 'the passed end is not the held end\'s peer')
        elif VARIANT == 'nested':
            c2 = socket.socket(fileno=got)
            c2.settimeout(5)
            msg2, fds2, _, _ = socket.recv_fds(c2, 100, 1)
            expect(msg2 == b'inner' and len(fds2) == 1, f'the passed end\'s own message: {msg2!r} {fds2}')
            expect(fd_target(fds2[0]) == '/var/task/handler.py', fd_target(fds2[0]))
            c2.send(b'back')
            d.settimeout(5)
            expect(d.recv(100) == b'back', 'the passed end is not the held end\'s peer')
        elif VARIANT == 'orphan':
            expect(os.read(got, 100) == b'x', 'the byte in the passed pipe is lost')
            expect(os.read(got, 100) == b'', 'a write end of the passed pipe is open')
        elif VARIANT == 'eventfd':
            expect(os.eventfd_read(got) == 5, 'the passed eventfd lost its count')
            expect(os.get_blocking(got) is False, 'the passed eventfd lost O_NONBLOCK')
    b.setblocking(False)
    try:
        extra = b.recv(100)
        expect(False, f'more was queued: {extra!r}')
    except BlockingIOError:
        pass
