# kind: clocks (CLOCK_MONOTONIC / BOOTTIME / REALTIME never go backwards across a restore; thread CPU time too)
# variants: monotonic boottime realtime monotonic_raw
# refusal-names: clock
from _probe import *
import time
CLK = {'monotonic': time.CLOCK_MONOTONIC, 'boottime': time.CLOCK_BOOTTIME, 'realtime': time.CLOCK_REALTIME,
       'monotonic_raw': time.CLOCK_MONOTONIC_RAW}[VARIANT]
BEFORE = time.clock_gettime_ns(CLK)


def check():
    now = time.clock_gettime_ns(CLK)
    expect(now >= BEFORE, f'{VARIANT} went backwards: {now} < {BEFORE} at init')
