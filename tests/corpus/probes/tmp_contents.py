# kind: /tmp contents (files, directories, symlinks, modes, mtimes, sparse files, /dev/shm, FIFOs, hard links)
# variants: file dir symlink mode mtime sparse large devshm fifo hardlink empty
# refusal-names: /tmp|/dev/shm
from _probe import *
base = '/dev/shm' if VARIANT == 'devshm' else '/tmp'
p = f'{base}/probe-{VARIANT}'
if VARIANT in ('file', 'mode', 'mtime', 'devshm'):
    open(p, 'wb').write(b'contents of ' + VARIANT.encode())
    if VARIANT == 'mode':
        os.chmod(p, 0o604)
    if VARIANT == 'mtime':
        os.utime(p, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
elif VARIANT == 'dir':
    os.makedirs(p + '/a/b/c')
    open(p + '/a/b/c/leaf', 'w').write('leaf')
elif VARIANT == 'symlink':
    os.symlink('does/not/matter', p)
elif VARIANT == 'sparse':
    with open(p, 'wb') as f:
        f.seek(10 << 20)
        f.write(b'end')
elif VARIANT == 'large':
    open(p, 'wb').write(bytes(range(256)) * (32 << 10))
elif VARIANT == 'fifo':
    os.mkfifo(p)
elif VARIANT == 'hardlink':
    open(p, 'w').write('x')
    os.link(p, p + '-2')
else:
    open(p, 'w').close()


def describe():
    st = os.lstat(p)
    d = {'mode': oct(st.st_mode), 'size': st.st_size}
    if VARIANT == 'mtime':
        d['mtime'] = st.st_mtime_ns
    if VARIANT == 'symlink':
        d['target'] = os.readlink(p)
    elif VARIANT == 'dir':
        d['leaf'] = open(p + '/a/b/c/leaf').read()
    elif VARIANT not in ('fifo',):
        d['data'] = __import__('hashlib').sha256(open(p, 'rb').read()).hexdigest()
    if VARIANT == 'hardlink':
        # One file with two names, not two copies.
        d['links'] = st.st_nlink
        d['same_file'] = os.lstat(p + '-2').st_ino == st.st_ino
    return d


WANT = describe()


def check():
    expect(os.path.lexists(p), f'{p} is gone')
    expect(describe() == WANT, f'{p}: {describe()}, want {WANT}')
