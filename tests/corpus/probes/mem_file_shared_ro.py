# kind: memory (a read-only MAP_SHARED mapping of a file in the bundle)
# variants: bundle
# refusal-names: shared
from _probe import *
import hashlib
path = '/var/task/handler.py'
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
a = mmap(size, PROT_READ, MAP_SHARED, fd)
os.close(fd)
WANT = open(path, 'rb').read()


def check():
    expect(ctypes.string_at(a, size) == WANT, 'shared file mapping differs')
    expect(mapping(a)[0] == 'r--s', f'perms {mapping(a)[0]}')
