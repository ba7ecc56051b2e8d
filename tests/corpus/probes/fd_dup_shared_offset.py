# kind: descriptors (dup'd descriptors share one open file description: one offset)
# variants: dup dup2
# refusal-names: dup|shared|description
from _probe import *
fd = os.open('/var/task/_probe.py', os.O_RDONLY)
fd2 = os.dup(fd) if VARIANT == 'dup' else os.dup2(fd, 200)
os.lseek(fd, 10, os.SEEK_SET)


def check():
    expect(os.lseek(fd2, 0, os.SEEK_CUR) == 10, f'dup offset {os.lseek(fd2, 0, os.SEEK_CUR)}')
    os.lseek(fd, 100, os.SEEK_SET)
    expect(os.lseek(fd2, 0, os.SEEK_CUR) == 100, 'dup no longer shares the offset with its original')
