# kind: descriptors (character devices held open)
# variants: null zero urandom
# refusal-names: device|/dev
from _probe import *
path = '/dev/' + VARIANT
fd = os.open(path, os.O_RDONLY)


def check():
    expect(fd_target(fd) == path, fd_target(fd))
    data = os.read(fd, 16)
    expect(len(data) == (0 if VARIANT == 'null' else 16), f'read {len(data)} bytes')
