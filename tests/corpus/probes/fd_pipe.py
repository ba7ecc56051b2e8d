# kind: descriptors (a pipe inside the process: empty, with buffered bytes, non-blocking, close-on-exec, one end closed, resized, packet mode)
# variants: empty buffered nonblock cloexec full writer_closed reader_closed resized packet
# refusal-names: pipe
from _probe import *
import fcntl
r, w = os.pipe2({'nonblock': os.O_NONBLOCK, 'cloexec': os.O_CLOEXEC, 'packet': os.O_DIRECT}.get(VARIANT, 0))
if VARIANT == 'resized':
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
SIZE = fcntl.fcntl(r, fcntl.F_GETPIPE_SZ)
DATA = {'buffered': b'in the pipe', 'full': b'x' * 60000, 'writer_closed': b'left for the reader'}.get(VARIANT, b'')
if DATA:
    os.write(w, DATA)
if VARIANT == 'writer_closed':
    # What a finished subprocess leaves: its output, then the end of the stream.
    os.close(w)
elif VARIANT == 'reader_closed':
    os.close(r)


def check():
    if VARIANT == 'writer_closed':
        expect(fd_target(r).startswith('pipe:'), fd_target(r))
        got = b''
        while True:
            b = os.read(r, 65536)  # blocks if a write end is still open somewhere
            if not b:
                break
            got += b
        expect(got == DATA, f'read {got!r} then the end of the stream, want {DATA!r}')
        return
    expect(fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == SIZE, f'pipe size {fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)}, want {SIZE}')
    if VARIANT == 'packet':
        # Packet mode: each write is read as one packet.
        os.write(w, b'ab')
        os.write(w, b'cd')
        expect(os.read(r, 100) == b'ab', 'packet mode lost (two writes read as one)')
        expect(os.read(r, 100) == b'cd', 'the second packet')
        return
    if VARIANT == 'resized':
        os.set_blocking(w, False)
        n = 0
        try:
            while n < (1 << 21):
                n += os.write(w, b'x' * 65536)
        except BlockingIOError:
            pass
        expect(n == SIZE, f'the pipe took {n} bytes, its size is {SIZE}')
        return
    if VARIANT == 'reader_closed':
        expect(fd_target(w).startswith('pipe:'), fd_target(w))
        try:
            os.write(w, b'x')
            expect(False, 'a write with no reader left succeeded')
        except BrokenPipeError:
            pass
        return
    expect(fd_target(r).startswith('pipe:') and fd_target(r) == fd_target(w), f'{fd_target(r)} / {fd_target(w)}')
    os.set_blocking(r, False)
    try:
        got = b''
        while len(got) < len(DATA):
            got += os.read(r, 65536)
    except BlockingIOError:
        pass
    expect(got == DATA, f'pipe held {len(got)} bytes, want {len(DATA)}')
    os.write(w, b'ping')
    expect(os.read(r, 4) == b'ping', 'pipe does not connect its ends')
    if VARIANT == 'nonblock':
        expect(not os.get_blocking(w), 'O_NONBLOCK lost')
    if VARIANT == 'cloexec':
        expect(fcntl.fcntl(r, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, 'FD_CLOEXEC lost')
