# kind: memory (private anonymous memory of several sizes, every page written)
# variants: 1page 1m 64m sparse
# refusal-names: memory
from _probe import *
N = {'1page': PAGE, '1m': 1 << 20, '64m': 64 << 20, 'sparse': 1 << 30}[VARIANT]
a = mmap(N, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
STEP = 1 << 20 if VARIANT == 'sparse' else PAGE
for off in range(0, N, STEP):
    ctypes.memmove(a + off, struct.pack('<QQ', 7, off) * (PAGE // 16), PAGE)


def check():
    for off in range(0, N, STEP):
        expect(ctypes.string_at(a + off, PAGE) == struct.pack('<QQ', 7, off) * (PAGE // 16), f'page +{off:#x} differs')
    if VARIANT == 'sparse':
        expect(ctypes.string_at(a + PAGE, PAGE) == bytes(PAGE), 'untouched page not zero')
