# kind: descriptors (inotify: watching a /tmp directory, the code, after a watch was removed, with events queued)
# variants: dir file gap queued queued_many queued_removed
# refusal-names: inotify
from _probe import *
IN_ACCESS, IN_CREATE = 0x1, 0x100
IN_ALL_EVENTS, IN_OPEN, IN_CLOSE_NOWRITE = 0xfff, 0x20, 0x10
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


def events(of=None, cookies=False):
    out = []
    try:
        buf = os.read(fd if of is None else of, 65536)
    except BlockingIOError:
        return out
    at = 0
    while at < len(buf):
        w, mask, cookie, n = struct.unpack_from('<iIII', buf, at)
        name = buf[at + 16:at + 16 + n].rstrip(b'\0')
        out.append((w, mask, cookie, name) if cookies else (w, mask))
        at += 16 + n
    return out


def pairing(evs):
    # Events with their cookies replaced by their order of first appearance (a
    # rename's two events share one; its value is the kernel's to choose).
    seen = {}
    return [(w, m, (seen.setdefault(c, len(seen) + 1) if c else 0), n) for w, m, c, n in evs]


if VARIANT == 'queued':
    open('/tmp/watched/early', 'w').close()  # an event left waiting at the snapshot
    EXPECT = [(wd, IN_CREATE, 0, b'early')]
elif VARIANT == 'queued_removed':
    # A watch removed with its IN_IGNORED left unread: refused by name (an event of a
    # watch that no longer exists cannot be caused again).
    gone = check_errno(libc.inotify_add_watch(fd, b'/tmp', IN_CREATE), 'inotify_add_watch')
    check_errno(libc.inotify_rm_watch(fd, gone), 'inotify_rm_watch')
    EXPECT = [(gone, 0x8000, 0, b'')]
elif VARIANT == 'queued_many':
    # Every kind of event a restore can cause again, left waiting at the snapshot, on
    # a directory watch and a watch of the code; a second instance watching the same
    # is read at init, so its events are the ones expected of the first (and it must
    # have none after the restore).
    other = check_errno(libc.inotify_init1(os.O_NONBLOCK), 'inotify_init1')
    check_errno(libc.inotify_add_watch(fd, b'/tmp/watched', IN_ALL_EVENTS), 'inotify_add_watch')
    check_errno(libc.inotify_add_watch(other, b'/tmp/watched', IN_ALL_EVENTS), 'inotify_add_watch')
    code = check_errno(libc.inotify_add_watch(fd, b'/var/task/handler.py', IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE), 'inotify_add_watch')
    check_errno(libc.inotify_add_watch(other, b'/var/task/handler.py', IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE), 'inotify_add_watch')
    with open('/tmp/watched/a', 'w') as f:
        f.write('hello')
    os.chmod('/tmp/watched/a', 0o640)
    os.rename('/tmp/watched/a', '/tmp/watched/b')
    os.mkdir('/tmp/watched/d')
    os.rmdir('/tmp/watched/d')
    with open('/tmp/watched/b') as f:
        f.read()
    with open('/tmp/watched/kept', 'w') as f:
        f.write('kept')
    with open('/var/task/handler.py', 'rb') as f:
        f.read(1)
    EXPECT = pairing(events(other, cookies=True))
    STAT = {n: os.stat('/tmp/watched/' + n) for n in ('b', 'kept')}
    DIR_MTIME = os.stat('/tmp/watched').st_mtime_ns


def check():
    expect(fd_target(fd) == 'anon_inode:inotify', fd_target(fd))
    if VARIANT == 'gap':
        expect((wd, code) == (2, 3), f'watch descriptors {wd}, {code}')
    if VARIANT.startswith('queued'):
        got = pairing(events(cookies=True))
        expect(got == EXPECT, f'events queued at the snapshot: {got}, expected {EXPECT}')
        expect(all(c for w, m, c, n in got if m & 0xc0), 'a rename\'s events lost their cookie')
    else:
        expect(events() == [], 'events nobody caused are queued')
    if VARIANT == 'queued_many':
        expect(events(other) == [], 'the other instance has events nobody caused')
        expect(sorted(os.listdir('/tmp/watched')) == ['b', 'kept'], f'/tmp/watched holds {sorted(os.listdir("/tmp/watched"))}')
        for n, st in STAT.items():
            now = os.stat('/tmp/watched/' + n)
            expect((now.st_mode, now.st_size, now.st_mtime_ns) == (st.st_mode, st.st_size, st.st_mtime_ns), f'{n} changed: {now} vs {st}')
        expect(open('/tmp/watched/b').read() == 'hello', 'b lost its contents')
        expect(os.stat('/tmp/watched').st_mtime_ns == DIR_MTIME, 'the watched directory\'s time changed')
    open('/tmp/watched/new', 'w').close()
    got = events()
    expect(any(w == wd and mask & IN_CREATE for w, mask in got), f'events {got}')
    if code is not None:
        with open('/var/task/handler.py', 'rb') as f:
            f.read(1)
        got = events()
        expect(any(w == code and mask & IN_ACCESS for w, mask in got), f'events on the code {got}')
