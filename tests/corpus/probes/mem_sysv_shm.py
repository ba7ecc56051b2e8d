# kind: memory (System V shared memory segment, attached; or created and detached)
# variants: attached detached
# refusal-names: SYSV|shm
from _probe import *
N = 4 * PAGE
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
shmid = check_errno(libc.shmget(IPC_PRIVATE, N, IPC_CREAT | 0o600), 'shmget')
a = check_errno(libc.shmat(shmid, None, 0), 'shmat')
fill(a, N, 88)
if VARIANT == 'detached':
    libc.shmdt(ctypes.c_void_p(a))


def check():
    if VARIANT == 'attached':
        verify(a, N, 88, 'SysV shm')
    b = check_errno(libc.shmat(shmid, None, 0), f'shmat({shmid}) after restore')
    verify(b, N, 88, 'SysV shm re-attached')
