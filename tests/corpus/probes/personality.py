# kind: personality (execution domain flags)
# variants: addr_no_randomize read_implies_exec mmap_page_zero
# refusal-names: personality
from _probe import *
FLAG = {'addr_no_randomize': 0x0040000, 'read_implies_exec': 0x0400000, 'mmap_page_zero': 0x0100000}[VARIANT]
libc.personality.restype = ctypes.c_int
cur = libc.personality(0xffffffff)
libc.personality(cur | FLAG)
WANT = libc.personality(0xffffffff)


def check():
    got = libc.personality(0xffffffff)
    expect(got == WANT, f'personality {got:#x}, want {WANT:#x}')
