# kind: memory (madvise state: DONTNEED'd pages read as zero; DONTFORK / WIPEONFORK flags kept)
# variants: dontneed dontfork wipeonfork
# refusal-names: madv
from _probe import *
MADV_DONTNEED, MADV_DONTFORK, MADV_WIPEONFORK = 4, 10, 18
N = 8 * PAGE
a = mmap(N)
fill(a, N // 2, 99)
fill(a + N // 2, N // 2, 98)
advice = {'dontneed': MADV_DONTNEED, 'dontfork': MADV_DONTFORK, 'wipeonfork': MADV_WIPEONFORK}[VARIANT]
check_errno(libc.madvise(a, N // 2, advice), 'madvise')


def check():
    if VARIANT == 'dontneed':
        expect(ctypes.string_at(a, N // 2) == bytes(N // 2), 'DONTNEED pages are not zero')
    else:
        flag = 'dc' if VARIANT == 'dontfork' else 'wf'
        expect(flag in mapping(a)[2], f'VmFlags {mapping(a)[2]} lack {flag}')
        verify(a, N // 2, 99, 'advised half')
    verify(a + N // 2, N // 2, 98, 'untouched half')
