# kind: descriptors (a unix socketpair inside the process, with buffered data)
# variants: stream dgram seqpacket
# refusal-names: socket
from _probe import *
import socket
T = {'stream': socket.SOCK_STREAM, 'dgram': socket.SOCK_DGRAM, 'seqpacket': socket.SOCK_SEQPACKET}[VARIANT]
a, b = socket.socketpair(socket.AF_UNIX, T)
a.send(b'queued')


def check():
    b.settimeout(5)
    expect(b.recv(100) == b'queued', 'buffered message lost')
    b.send(b'back')
    a.settimeout(5)
    expect(a.recv(100) == b'back', 'the pair is not connected')
