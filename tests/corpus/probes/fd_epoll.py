# kind: descriptors (an epoll set: level/edge-triggered, oneshot, several fds, with data)
# variants: pipe eventfd edge oneshot many nested
# refusal-names: epoll
from _probe import *
import select
ep = select.epoll()
r, w = os.pipe()
efd = os.eventfd(0, os.EFD_NONBLOCK)
EV = {'edge': select.EPOLLIN | select.EPOLLET, 'oneshot': select.EPOLLIN | select.EPOLLONESHOT}.get(VARIANT, select.EPOLLIN)
if VARIANT == 'eventfd':
    ep.register(efd, EV)
    watched = [efd]
elif VARIANT == 'many':
    watched = []
    for _ in range(8):
        a, b = os.pipe()
        ep.register(a, select.EPOLLIN)
        watched.append((a, b))
elif VARIANT == 'nested':
    inner = select.epoll()
    inner.register(r, select.EPOLLIN)
    ep.register(inner.fileno(), select.EPOLLIN)
else:
    ep.register(r, EV)


def check():
    if VARIANT == 'eventfd':
        os.eventfd_write(efd, 1)
        expect(ep.poll(5) == [(efd, select.EPOLLIN)], 'eventfd readiness not reported')
    elif VARIANT == 'many':
        os.write(watched[5][1], b'x')
        expect(ep.poll(5) == [(watched[5][0], select.EPOLLIN)], 'wrong member reported')
    elif VARIANT == 'nested':
        os.write(w, b'x')
        expect(ep.poll(5) == [(inner.fileno(), select.EPOLLIN)], 'nested epoll not reported')
    else:
        expect(ep.poll(0) == [], 'spurious event')
        os.write(w, b'x')
        expect(ep.poll(5) == [(r, select.EPOLLIN)], 'pipe readiness not reported')
        if VARIANT in ('edge', 'oneshot'):
            expect(ep.poll(0) == [], f'{VARIANT}: reported twice')
