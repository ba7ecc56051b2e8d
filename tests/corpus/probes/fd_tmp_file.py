# kind: descriptors (a /tmp file held open for reading, writing, appending or read-write)
# variants: rdonly wronly append rdwr
# refusal-names: writing|/tmp/held
from _probe import *
path = '/tmp/held'
with open(path, 'wb') as f:
    f.write(b'0123456789')
FLAGS = {'rdonly': os.O_RDONLY, 'wronly': os.O_WRONLY, 'append': os.O_WRONLY | os.O_APPEND, 'rdwr': os.O_RDWR}[VARIANT]
fd = os.open(path, FLAGS)
os.lseek(fd, 4, os.SEEK_SET)


def check():
    fl = int(fdinfo(fd).split('flags:')[1].split()[0], 8)
    expect(fl & (os.O_ACCMODE | os.O_APPEND) == FLAGS, f'flags {fl:o}, want {FLAGS:o}')
    expect(os.lseek(fd, 0, os.SEEK_CUR) == 4, f'offset {os.lseek(fd, 0, os.SEEK_CUR)}')
    if VARIANT == 'rdonly':
        expect(os.read(fd, 100) == b'456789', 'read from offset differs')
        return
    os.write(fd, b'XY')
    want = b'0123456789XY' if VARIANT == 'append' else b'0123XY6789'
    expect(open(path, 'rb').read() == want, f'file is {open(path, "rb").read()!r}, want {want!r}')
