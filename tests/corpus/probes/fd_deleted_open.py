# kind: descriptors (a /tmp file open, then deleted)
# variants: read write
# refusal-names: deleted
from _probe import *
path = '/tmp/open-then-deleted'
with open(path, 'wb') as f:
    f.write(b'still here')
fd = os.open(path, os.O_RDONLY if VARIANT == 'read' else os.O_RDWR)
os.unlink(path)


def check():
    expect(fd_target(fd).endswith('(deleted)'), f'fd is {fd_target(fd)}')
    expect(os.pread(fd, 100, 0) == b'still here', 'contents differ')
    expect(not os.path.exists(path), 'the deleted file came back')
