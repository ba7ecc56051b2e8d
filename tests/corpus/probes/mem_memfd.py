# kind: memory (memfd_create: mapped shared, mapped private, mapped with its descriptor closed, or only held open)
# variants: shared private shared-closed fdonly sealed
# refusal-names: memfd
from _probe import *
N = 8 * PAGE
fd = os.memfd_create('probe', os.MFD_ALLOW_SEALING)
os.ftruncate(fd, N)
os.pwrite(fd, b'm' * N, 0)
a = None
if VARIANT in ('shared', 'private', 'shared-closed'):
    a = mmap(N, flags=MAP_PRIVATE if VARIANT == 'private' else MAP_SHARED, fd=fd)
    fill(a, N, 77)
if VARIANT == 'shared-closed':
    # What V8 and JITs do: map the memfd, keep only the mapping.
    os.close(fd)
    fd = None
if VARIANT == 'sealed':
    import fcntl
    fcntl.fcntl(fd, 1033, 0x0002 | 0x0004)  # F_ADD_SEALS: SHRINK | GROW


def check():
    if a is not None:
        verify(a, N, 77, 'memfd mapping')
        expect(mapping(a)[1].startswith('/memfd:probe'), f'mapping name {mapping(a)[1]}')
    if fd is None:
        expect(not any(fd_target(int(n)).startswith('/memfd:') for n in os.listdir('/proc/self/fd')
                       if os.path.exists(f'/proc/self/fd/{n}')), 'a memfd descriptor the process had closed is open')
        return
    expect(fd_target(fd).startswith('/memfd:probe'), f'fd {fd} is {fd_target(fd)}')
    expect(os.fstat(fd).st_size == N, f'size {os.fstat(fd).st_size}')
    want = b'm' * N if VARIANT != 'shared' else ctypes.string_at(a, N)
    expect(os.pread(fd, N, 0) == want, 'memfd contents differ')
    if VARIANT == 'shared':
        # One object: a write through the descriptor shows in the mapping.
        first = os.pread(fd, 1, 0)
        os.pwrite(fd, b'Z', 0)
        shared = ctypes.string_at(a, 1) == b'Z'
        os.pwrite(fd, first, 0)
        expect(shared, 'the mapping and the descriptor are no longer one memfd')
    if VARIANT == 'sealed':
        import fcntl
        expect(fcntl.fcntl(fd, 1034) & 0x6 == 0x6, 'seals lost')
