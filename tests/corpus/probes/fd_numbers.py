# kind: descriptors (descriptor numbers: a gap, a high number, past the scratch range base, just below and at the number the engine keeps its userfaultfd at)
# variants: gap high699 scratch800 below1000 at1000
# refusal-names: 700|descriptor
from _probe import *
N = {'gap': 64, 'high699': 699, 'scratch800': 800, 'below1000': 999, 'at1000': 1000}[VARIANT]
fd = os.open('/var/task/handler.py', os.O_RDONLY)
os.dup2(fd, N)
os.close(fd)


def check():
    expect(fd_target(N) == '/var/task/handler.py', f'fd {N} is {fd_target(N)}')
    expect(not os.path.exists(f'/proc/self/fd/{fd}'), f'fd {fd} was closed but is open')
