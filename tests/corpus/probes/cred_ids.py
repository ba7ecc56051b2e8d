# kind: credentials (uid/gid/groups, capabilities, no_new_privs, dumpable, umask)
# variants: ids caps nonewprivs dumpable umask077 umask002
# refusal-names: credential
from _probe import *
if VARIANT == 'nonewprivs':
    check_errno(libc.prctl(38, 1, 0, 0, 0), 'PR_SET_NO_NEW_PRIVS')
elif VARIANT == 'dumpable':
    check_errno(libc.prctl(4, 0, 0, 0, 0), 'PR_SET_DUMPABLE')
elif VARIANT.startswith('umask'):
    os.umask(int(VARIANT[5:], 8))


def state():
    return {
        'ids': lambda: (os.getresuid(), os.getresgid(), sorted(os.getgroups())),
        'caps': lambda: [status_field(f) for f in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')],
        'nonewprivs': lambda: libc.prctl(39, 0, 0, 0, 0),
        'dumpable': lambda: libc.prctl(3, 0, 0, 0, 0),
    }.get(VARIANT, lambda: status_field('Umask'))()


WANT = state()


def check():
    expect(state() == WANT, f'{VARIANT}: {state()}, want {WANT}')
