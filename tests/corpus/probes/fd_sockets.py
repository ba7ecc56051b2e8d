# kind: descriptors (sockets that leave the process: TCP listener, UDP, unix listener, netlink)
# variants: tcp-listen udp unix-listen netlink
# refusal-names: socket
from _probe import *
import socket
if VARIANT == 'tcp-listen':
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    s.listen()
elif VARIANT == 'udp':
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(('127.0.0.1', 0))
elif VARIANT == 'unix-listen':
    s = socket.socket(socket.AF_UNIX)
    s.bind('/tmp/probe.sock')
    s.listen()
else:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
NAME = s.getsockname()


def check():
    expect(s.getsockname() == NAME, f'{s.getsockname()} != {NAME}')
