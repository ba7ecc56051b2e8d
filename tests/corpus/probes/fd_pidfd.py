# kind: descriptors (a pidfd of the process itself)
# variants: self
# refusal-names: pidfd
from _probe import *
fd = os.pidfd_open(os.getpid())


def check():
    expect(fd_target(fd) == 'anon_inode:[pidfd]', fd_target(fd))
    expect(f'Pid:\t{os.getpid()}' in fdinfo(fd), fdinfo(fd))
