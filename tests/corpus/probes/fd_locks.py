# kind: descriptors (file locks on a /tmp file: flock, POSIX record lock, OFD lock)
# variants: flock posix ofd
# refusal-names: lock
from _probe import *
import fcntl
path = '/tmp/locked'
open(path, 'w').close()
fd = os.open(path, os.O_RDWR)
if VARIANT == 'flock':
    fcntl.flock(fd, fcntl.LOCK_EX)
elif VARIANT == 'posix':
    fcntl.lockf(fd, fcntl.LOCK_EX)
else:
    fcntl.fcntl(fd, 37, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLK


def check():
    with open('/proc/locks') as f:
        locks = f.read()
    ino = os.fstat(fd).st_ino
    want = {'flock': 'FLOCK', 'posix': 'POSIX', 'ofd': 'OFDLCK'}[VARIANT]
    expect(any(want in l and f':{ino} ' in l for l in locks.splitlines()), f'{want} lock on inode {ino} lost: {locks!r}')
