# kind: rlimits (a lowered soft limit of each resource)
# variants: nofile stack core as nproc cpu data memlock fsize msgqueue nice rtprio sigpending
# refusal-names: limit
from _probe import *
import resource
RES = getattr(resource, 'RLIMIT_' + VARIANT.upper())
soft, hard = resource.getrlimit(RES)
new = {'nofile': 900, 'stack': 4 << 20, 'core': 0, 'as': 6 << 30, 'nproc': 500, 'cpu': 3600, 'data': 5 << 30,
       'memlock': 32768, 'fsize': 1 << 30, 'msgqueue': 4096, 'nice': 0, 'rtprio': 0, 'sigpending': 100}[VARIANT]
if hard != resource.RLIM_INFINITY:
    new = min(new, hard)
resource.setrlimit(RES, (new, hard))
WANT = resource.getrlimit(RES)


def check():
    expect(resource.getrlimit(RES) == WANT, f'{VARIANT}: {resource.getrlimit(RES)}, want {WANT}')
