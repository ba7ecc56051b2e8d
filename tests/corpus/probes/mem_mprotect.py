# kind: memory (mprotect'd pages inside an anonymous mapping)
# variants: none read readexec
# refusal-names: mprotect
from _probe import *
N = 12 * PAGE
a = mmap(N)
fill(a, N, 22)
PROT = {'none': PROT_NONE, 'read': PROT_READ, 'readexec': PROT_READ | PROT_EXEC}[VARIANT]
WANT = {'none': '---p', 'read': 'r--p', 'readexec': 'r-xp'}[VARIANT]
libc.mprotect(a + 4 * PAGE, 4 * PAGE, PROT)


def check():
    expect(mapping(a)[0] == 'rw-p', f'head perms {mapping(a)[0]}')
    expect(mapping(a + 4 * PAGE)[0] == WANT, f'middle perms {mapping(a + 4 * PAGE)[0]}, want {WANT}')
    expect(mapping(a + 8 * PAGE)[0] == 'rw-p', f'tail perms {mapping(a + 8 * PAGE)[0]}')
    check_errno(libc.mprotect(a + 4 * PAGE, 4 * PAGE, PROT_READ | PROT_WRITE), 'mprotect back')
    verify(a, N, 22, 'mprotected region')
