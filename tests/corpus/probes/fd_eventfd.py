# kind: descriptors (eventfd with a counter, semaphore mode, non-blocking)
# variants: zero counter semaphore nonblock
# refusal-names: eventfd
from _probe import *
flags = {'semaphore': os.EFD_SEMAPHORE, 'nonblock': os.EFD_NONBLOCK}.get(VARIANT, 0)
fd = os.eventfd(0 if VARIANT == 'zero' else 7, flags | os.EFD_NONBLOCK if VARIANT == 'zero' else flags)


def check():
    expect(fd_target(fd) == 'anon_inode:[eventfd]', fd_target(fd))
    info = fdinfo(fd)
    want = 0 if VARIANT == 'zero' else 7
    expect(f'eventfd-count:{want:16x}'.replace(' ', '') in info.replace(' ', '') or f'eventfd-count: {want:x}' in info, f'fdinfo {info!r}')
    if VARIANT == 'semaphore':
        expect(os.eventfd_read(fd) == 1, 'semaphore mode lost')
    elif VARIANT != 'zero':
        expect(os.eventfd_read(fd) == 7, 'counter differs')
    if VARIANT in ('zero', 'nonblock'):
        expect(not os.get_blocking(fd), 'EFD_NONBLOCK lost')
