# kind: descriptors (per-descriptor flags: close-on-exec, O_NONBLOCK on a file, O_PATH, a directory)
# variants: cloexec nonblock opath directory
# refusal-names: flag|path|directory
from _probe import *
import fcntl
if VARIANT == 'cloexec':
    fd = os.open('/var/task/handler.py', os.O_RDONLY | os.O_CLOEXEC)
elif VARIANT == 'nonblock':
    fd = os.open('/var/task/handler.py', os.O_RDONLY | os.O_NONBLOCK)
elif VARIANT == 'opath':
    fd = os.open('/var/task', os.O_PATH)
else:
    fd = os.open('/var/task', os.O_RDONLY | os.O_DIRECTORY)


def check():
    fl = int(fdinfo(fd).split('flags:')[1].split()[0], 8)
    if VARIANT == 'cloexec':
        expect(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, 'FD_CLOEXEC lost')
    elif VARIANT == 'nonblock':
        expect(fl & os.O_NONBLOCK, f'flags {fl:o} lack O_NONBLOCK')
    elif VARIANT == 'opath':
        expect(fl & os.O_PATH, f'flags {fl:o} lack O_PATH')
    else:
        expect(sorted(os.listdir(fd)) == sorted(os.listdir('/var/task')), 'directory fd lists something else')
