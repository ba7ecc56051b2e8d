# kind: descriptors (a descriptor in flight over a unix socket: sent, not yet received)
# variants: file
# refusal-names: socket
from _probe import *
import socket
a, b = socket.socketpair()
fd = os.open('/var/task/handler.py', os.O_RDONLY)
socket.send_fds(a, [b'fd'], [fd])
os.close(fd)


def check():
    b.settimeout(5)
    msg, fds, _, _ = socket.recv_fds(b, 100, 1)
    expect(msg == b'fd' and len(fds) == 1, f'received {msg!r} {fds}')
    expect(fd_target(fds[0]) == '/var/task/handler.py', fd_target(fds[0]))
