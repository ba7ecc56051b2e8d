"""Shared helpers of the conformance probes (tests/corpus/README.md).

A probe module sets up ONE kind of kernel-visible state when it is imported (the
function's init, before the snapshot) and defines check(), run by the handler after
the restore; check() raises Failure (via expect) with what differs."""
import ctypes
import ctypes.util
import os
import struct

libc = ctypes.CDLL(None, use_errno=True)
VARIANT = os.environ.get('PROBE_VARIANT', '')

PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_GROWSDOWN, MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x100, 0x4000, 0x100000
MAP_FAILED = ctypes.c_void_p(-1).value

libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.syscall.restype = ctypes.c_long
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]

PAGE = 4096


class Failure(Exception):
    pass


def expect(cond, detail):
    if not cond:
        raise Failure(detail)


def check_errno(res, what):
    if res == -1 or res is None or res == MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, f'{what}: {os.strerror(e)}')
    return res


def mmap(length, prot=PROT_READ | PROT_WRITE, flags=MAP_PRIVATE | MAP_ANONYMOUS, fd=-1, offset=0, addr=None):
    return check_errno(libc.mmap(addr, length, prot, flags, fd, offset), 'mmap')


def fill(addr, length, seed):
    """Write a pattern depending on seed and the page number into [addr, addr+length)."""
    for off in range(0, length, PAGE):
        ctypes.memmove(addr + off, struct.pack('<QQ', seed, off) * (PAGE // 16), PAGE)


def verify(addr, length, seed, what='memory'):
    for off in range(0, length, PAGE):
        got = ctypes.string_at(addr + off, PAGE)
        expect(got == struct.pack('<QQ', seed, off) * (PAGE // 16), f'{what}: page at +{off:#x} differs (starts {got[:16].hex()})')


def mapping(addr):
    """(perms, name, vmflags) of the VMA containing addr, from /proc/self/smaps."""
    cur = None
    with open('/proc/self/smaps') as f:
        for line in f:
            head = line.split()
            if '-' in head[0] and len(head) >= 5 and not head[0].endswith(':'):
                lo, hi = (int(x, 16) for x in head[0].split('-'))
                cur = [head[1], ' '.join(head[5:]), ''] if lo <= addr < hi else None
                if cur:
                    cur.append((lo, hi))
            elif cur is not None and line.startswith('VmFlags:'):
                cur[2] = line.split(':', 1)[1].split()
                return cur
    raise Failure(f'no mapping contains {addr:#x}')


def status_field(name, pid='self'):
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith(name + ':'):
                return line.split(':', 1)[1].strip()
    raise Failure(f'no {name} in /proc/{pid}/status')


def fdinfo(fd):
    with open(f'/proc/self/fdinfo/{fd}') as f:
        return f.read()


def fd_target(fd):
    return os.readlink(f'/proc/self/fd/{fd}')
