"""~200 MiB of non-zero module-level data; each call touches one block.

Each of the 200 blocks is 1 MiB of a 256-byte pattern that differs per
block (bytes 1..255 only, never 0), so neither the kernel nor a snapshot
can treat the pages as zero pages.  Building it takes well under a second
(bytes repetition is a memcpy).
"""

BLOCKS = 200
BLOCK_SIZE = 1 << 20
_PATTERN_LEN = 256


def _block(i):
    pattern = bytes(((i * 31 + j * 7) % 255) + 1 for j in range(_PATTERN_LEN))
    return pattern * (BLOCK_SIZE // _PATTERN_LEN)


DATA = [_block(i) for i in range(BLOCKS)]


def handler(event, context):
    i = 0
    if isinstance(event, dict):
        i = int(event.get("i", 0))
    idx = i % BLOCKS
    block = DATA[idx]
    # touch a few bytes spread over the block (one per 64 KiB page group)
    sample = block[::65536]
    return {
        "block": idx,
        "blocks": len(DATA),
        "sample_sum": sum(sample),
        "first": block[0],
        "last": block[-1],
    }
