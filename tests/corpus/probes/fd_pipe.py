# kind: descriptors (a pipe inside the process: empty, with buffered bytes, non-blocking, close-on-exec)
# variants: empty buffered nonblock cloexec full
# refusal-names: pipe
from _probe import *
import fcntl
r, w = os.pipe2({'nonblock': os.O_NONBLOCK, 'cloexec': os.O_CLOEXEC}.get(VARIANT, 0))
DATA = {'buffered': b'in the pipe', 'full': b'x' * 60000}.get(VARIANT, b'')
if DATA:
    os.write(w, DATA)


def check():
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
