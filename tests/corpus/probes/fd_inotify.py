# kind: descriptors (inotify watching a /tmp directory)
# variants: dir
# refusal-names: inotify
from _probe import *
os.makedirs('/tmp/watched', exist_ok=True)
fd = check_errno(libc.inotify_init1(os.O_NONBLOCK), 'inotify_init1')
wd = check_errno(libc.inotify_add_watch(fd, b'/tmp/watched', 0x100), 'inotify_add_watch')  # IN_CREATE


def check():
    expect(fd_target(fd) == 'anon_inode:inotify', fd_target(fd))
    open('/tmp/watched/new', 'w').close()
    ev = os.read(fd, 4096)
    w, mask = struct.unpack_from('<iI', ev)
    expect(w == wd and mask & 0x100, f'event wd {w} mask {mask:#x}')
