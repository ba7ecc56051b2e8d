# kind: descriptors (a read-only file of the bundle open at an offset)
# variants: start middle end
# refusal-names: file
from _probe import *
path = '/var/task/_probe.py'
DATA = open(path, 'rb').read()
OFF = {'start': 0, 'middle': len(DATA) // 2, 'end': len(DATA)}[VARIANT]
fd = os.open(path, os.O_RDONLY)
os.lseek(fd, OFF, os.SEEK_SET)


def check():
    expect(fd_target(fd) == path, f'fd {fd} is {fd_target(fd)}')
    pos = os.lseek(fd, 0, os.SEEK_CUR)
    expect(pos == OFF, f'offset {pos}, want {OFF}')
    expect(os.read(fd, 1 << 20) == DATA[OFF:], 'contents from the offset differ')
