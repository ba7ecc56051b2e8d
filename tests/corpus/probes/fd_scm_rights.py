# kind: descriptors (descriptors in flight over a unix socket: sent, not yet received)
# variants: file two tmp held pipe
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
    # Sent and still held: refused by name (a restore would make two open files).
    held = os.open('/var/task/handler.py', os.O_RDONLY)
    socket.send_fds(a, [b'held'], [held])
elif VARIANT == 'pipe':
    r, w = os.pipe()
    socket.send_fds(a, [b'pipe'], [r])  # refused by name: only files travel
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
    b.setblocking(False)
    try:
        extra = b.recv(100)
        expect(False, f'more was queued: {extra!r}')
    except BlockingIOError:
        pass
