# kind: descriptors (inotify: watching a /tmp directory, the code, after a watch was removed, with events queued)
# variants: dir file gap queued
# refusal-names: inotify
from _probe import *
IN_ACCESS, IN_CREATE = 0x1, 0x100
os.makedirs('/tmp/watched', exist_ok=True)
fd = check_errno(libc.inotify_init1(os.O_NONBLOCK), 'inotify_init1')
if VARIANT == 'gap':
    # A watch removed before the snapshot: the next ones keep their numbers (2, 3).
    first = check_errno(libc.inotify_add_watch(fd, b'/tmp', IN_CREATE), 'inotify_add_watch')
    check_errno(libc.inotify_rm_watch(fd, first), 'inotify_rm_watch')
    os.read(fd, 4096)  # its IN_IGNORED event
wd = check_errno(libc.inotify_add_watch(fd, b'/tmp/watched', IN_CREATE), 'inotify_add_watch')
code = None
if VARIANT in ('file', 'gap'):
    code = check_errno(libc.inotify_add_watch(fd, b'/var/task/handler.py', IN_ACCESS), 'inotify_add_watch')
if VARIANT == 'queued':
    open('/tmp/watched/early', 'w').close()  # an event left waiting at the snapshot


def events():
    out = []
    try:
        buf = os.read(fd, 4096)
    except BlockingIOError:
        return out
    at = 0
    while at < len(buf):
        w, mask, _, n = struct.unpack_from('<iIII', buf, at)
        out.append((w, mask))
        at += 16 + n
    return out


def check():
    expect(fd_target(fd) == 'anon_inode:inotify', fd_target(fd))
    if VARIANT == 'gap':
        expect((wd, code) == (2, 3), f'watch descriptors {wd}, {code}')
    if VARIANT != 'queued':
        expect(events() == [], 'events nobody caused are queued')
    open('/tmp/watched/new', 'w').close()
    got = events()
    expect(any(w == wd and mask & IN_CREATE for w, mask in got), f'events {got}')
    if code is not None:
        with open('/var/task/handler.py', 'rb') as f:
            f.read(1)
        got = events()
        expect(any(w == code and mask & IN_ACCESS for w, mask in got), f'events on the code {got}')
