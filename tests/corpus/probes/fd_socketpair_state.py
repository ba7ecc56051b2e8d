# kind: descriptors (unix socketpair state beyond queued bytes: a shut-down side, datagram boundaries and order, an empty datagram, non-blocking ends, an asyncio event loop's self-pipe, an end whose peer is closed, socket options)
# variants: shutdown messages emptydgram emptyrecord nonblock asyncio peer_closed peer_closed_dgram options
# refusal-names: socket
from _probe import *
import socket
if VARIANT == 'shutdown':
    a, b = socket.socketpair()
    a.send(b'last words')
    a.shutdown(socket.SHUT_WR)
elif VARIANT == 'messages':
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for i in range(5):
        a.send(b'm%d' % i * (i + 1))
    b.send(b'the other way')
elif VARIANT == 'emptydgram':
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.send(b'')
    a.send(b'after')
elif VARIANT == 'emptyrecord':
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.send(b'')
    a.send(b'after')
elif VARIANT == 'nonblock':
    a, b = socket.socketpair()
    a.setblocking(False)
elif VARIANT == 'options':
    # Options set on each end, not the defaults: credentials passed, buffer sizes,
    # timeouts, a peek offset. A datagram waits (sent before credentials were asked for).
    import struct
    SO_PEEK_OFF, SO_TIMESTAMP, SO_TIMESTAMPNS = 42, 29, 35  # not all in Python's socket module
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.send(b'queued')
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 40000)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack('ll', 2, 500000))
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack('ll', 7, 0))
    b.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, 0)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    a.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 3)
    OPTS = [(socket.SO_PASSCRED, 4), (socket.SO_RCVBUF, 4), (socket.SO_SNDBUF, 4), (socket.SO_RCVTIMEO, 16), (socket.SO_SNDTIMEO, 16), (SO_PEEK_OFF, 4),
            (socket.SO_RCVLOWAT, 4), (SO_TIMESTAMP, 4), (SO_TIMESTAMPNS, 4)]
    def options():
        return [(s.getsockopt(socket.SOL_SOCKET, o, n)) for s in (a, b) for o, n in OPTS]
    AT_INIT = options()
elif VARIANT in ('peer_closed', 'peer_closed_dgram'):
    # The peer said its last and closed: what it sent is still to be read.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM if VARIANT == 'peer_closed_dgram' else socket.SOCK_STREAM)
    a.send(b'last words')
    a.send(b'and more')
    a.close()
elif VARIANT == 'asyncio':
    import asyncio
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)


def check():
    if VARIANT == 'options':
        got = options()
        expect(got == AT_INIT, f'socket options {got}, at init {AT_INIT}')
        b.settimeout(5)
        expect(b.recv(100) == b'queued', 'the queued datagram is lost')
        return
    if VARIANT in ('peer_closed', 'peer_closed_dgram'):
        b.settimeout(5)
        if VARIANT == 'peer_closed':
            got = b''
            while True:
                chunk = b.recv(100)
                if not chunk:
                    break
                got += chunk
            expect(got == b'last wordsand more', f'read {got!r} then the end of the stream')
            try:
                b.send(b'x')
                expect(False, 'a send to a closed peer succeeded')
            except BrokenPipeError:
                pass
        else:
            expect(b.recv(100) == b'last words' and b.recv(100) == b'and more', 'the datagrams the peer sent are lost')
            try:
                b.send(b'x')
                expect(False, 'a send to a closed peer succeeded')
            except ConnectionRefusedError:
                pass
        return
    if VARIANT == 'shutdown':
        b.settimeout(5)
        expect(b.recv(100) == b'last words', 'queued bytes lost')
        expect(b.recv(100) == b'', 'the shut-down side is open again (no end of stream)')
        try:
            a.send(b'x')
            expect(False, 'sending on a shut-down side works again')
        except BrokenPipeError:
            pass
        b.send(b'still open this way')
        a.settimeout(5)
        expect(a.recv(100) == b'still open this way', 'the other direction is broken')
    elif VARIANT == 'messages':
        b.settimeout(5)
        got = [b.recv(100) for _ in range(5)]
        expect(got == [b'm%d' % i * (i + 1) for i in range(5)], f'datagrams merged, lost or reordered: {got}')
        a.settimeout(5)
        expect(a.recv(100) == b'the other way', 'the other direction lost its datagram')
    elif VARIANT in ('emptydgram', 'emptyrecord'):
        b.settimeout(5)
        expect(b.recv(100) == b'', 'the empty datagram was lost')
        expect(b.recv(100) == b'after', 'the datagram after it was lost')
    elif VARIANT == 'nonblock':
        expect(a.getblocking() is False and b.getblocking() is True, 'O_NONBLOCK not restored per end')
        try:
            a.recv(1)
            expect(False, 'a non-blocking recv on an empty socket returned')
        except BlockingIOError:
            pass
    elif VARIANT == 'asyncio':
        async def work():
            await asyncio.sleep(0.01)
            fut = loop.create_future()
            loop.call_soon_threadsafe(fut.set_result, 'woken')  # writes to the self-pipe socketpair
            return await asyncio.wait_for(fut, 5)
        expect(loop.run_until_complete(work()) == 'woken', 'the event loop did not run')
