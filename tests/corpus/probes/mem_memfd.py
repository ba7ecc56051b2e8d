# kind: memory (memfd_create: mapped shared, mapped private, or only held open)
# variants: shared private fdonly sealed
# refusal-names: memfd
from _probe import *
N = 8 * PAGE
fd = os.memfd_create('probe', os.MFD_ALLOW_SEALING)
os.ftruncate(fd, N)
os.pwrite(fd, b'm' * N, 0)
a = None
if VARIANT in ('shared', 'private'):
    a = mmap(N, flags=MAP_SHARED if VARIANT == 'shared' else MAP_PRIVATE, fd=fd)
    fill(a, N, 77)
if VARIANT == 'sealed':
    import fcntl
    fcntl.fcntl(fd, 1033, 0x0002 | 0x0004)  # F_ADD_SEALS: SHRINK | GROW


def check():
    expect(fd_target(fd).startswith('/memfd:probe'), f'fd {fd} is {fd_target(fd)}')
    expect(os.fstat(fd).st_size == N, f'size {os.fstat(fd).st_size}')
    if a is not None:
        verify(a, N, 77, 'memfd mapping')
    want = b'm' * N if VARIANT != 'shared' else ctypes.string_at(a, N)
    expect(os.pread(fd, N, 0) == want, 'memfd contents differ')
    if VARIANT == 'sealed':
        import fcntl
        expect(fcntl.fcntl(fd, 1034) & 0x6 == 0x6, 'seals lost')
