# kind: descriptors (file locks on a /tmp file: flock, POSIX record lock, OFD lock)
# variants: flock posix ofd posix-range
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
elif VARIANT == 'posix-range':
    fcntl.lockf(fd, fcntl.LOCK_SH, 10, 10)  # a read lock on bytes 10-19
else:
    fcntl.fcntl(fd, 37, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLK


def check():
    with open('/proc/locks') as f:
        locks = f.read()
    ino = os.fstat(fd).st_ino
    want, access, span = {'flock': ('FLOCK', 'WRITE', '0 EOF'), 'posix': ('POSIX', 'WRITE', '0 EOF'),
                          'ofd': ('OFDLCK', 'WRITE', '0 EOF'), 'posix-range': ('POSIX', 'READ', '10 19')}[VARIANT]
    expect(any(want in l and access in l and f':{ino} ' in l and l.endswith(' ' + span) for l in locks.splitlines()),
           f'{want} {access} lock on bytes {span} of inode {ino} lost: {locks!r}')
