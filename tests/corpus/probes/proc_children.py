# kind: live child processes started at init (workers, a subprocess, process groups and sessions), working with the runtime after the restore
# variants: pipe_worker pdeathsig attrs socket_worker groups exec_cat threaded_child mp_process live_and_zombie shared_end shared_anon shared_memfd mp_value
# refusal-names: process|shared memory
from _probe import *
import signal, socket, subprocess, threading, time


def stat_of(pid):
    with open(f'/proc/{pid}/stat') as f:
        s = f.read()
    rest = s[s.rindex(')') + 2:].split()
    return {'state': rest[0], 'ppid': int(rest[1]), 'pgrp': int(rest[2]), 'session': int(rest[3])}


def serve(read, write, tag):
    """A worker: state of its own built after the fork, one reply per request
    (the key, its value, how many it served, its pid and its parent's)."""
    table = {i: (i * 7919) % 1009 for i in range(5000)}
    blob = bytearray(b'%d' % os.getpid()) * 100000
    served = 0
    while True:
        data = read()
        if not data:
            os._exit(0)
        served += 1
        k = int(data)
        write(f'{tag}:{k}:{table[k]}:{served}:{os.getpid()}:{os.getppid()}:{len(blob)}\n'.encode())


def reply(tag, k, served, pid):
    return f'{tag}:{k}:{(k * 7919) % 1009}:{served}:{pid}:{os.getpid()}:{len(b"%d" % pid) * 100000}\n'.encode()


def fork_with_pipes(child):
    """A child given the read end of a request pipe and the write end of a reply pipe
    (`child(req_r, resp_w)`, which never returns); the runtime keeps the other ends:
    (pid, requests, replies)."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(resp_r)
        child(req_r, resp_w)
    os.close(req_r)
    os.close(resp_w)
    return pid, req_w, resp_r


def fork_pipe_worker(tag, threaded=False):
    def child(req_r, resp_w):
        args = (lambda: os.read(req_r, 64), lambda b: os.write(resp_w, b), tag)
        if threaded:
            # Served by a thread of the child; its main thread waits.
            threading.Thread(target=serve, args=args).start()
            while True:
                signal.pause()
        serve(*args)
    return fork_with_pipes(child)


def fork_reporter(setup, report):
    """A worker that runs `setup` after the fork, then answers every request byte
    with `report()`, and exits when the requests end."""
    def child(req_r, resp_w):
        setup()
        while os.read(req_r, 1):
            os.write(resp_w, report())
        os._exit(0)
    return fork_with_pipes(child)


def sleeper(setup=None):
    pid = os.fork()
    if pid == 0:
        if setup:
            setup()
        while True:
            signal.pause()
    return pid


if VARIANT == 'pipe_worker':
    PID, REQ, RESP = fork_pipe_worker('w')
    os.write(REQ, b'1')
    FIRST = os.read(RESP, 200)
elif VARIANT == 'pdeathsig':
    # A worker told to get SIGTERM when the runtime dies (prctl(PR_SET_PDEATHSIG)), as
    # a subprocess's preexec_fn does; it reports what it has.
    PR_GET_PDEATHSIG, PR_SET_PDEATHSIG = 2, 1

    def pdeathsig():
        sig = ctypes.c_int(0)
        libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(sig))
        return b'%d' % sig.value
    PID, REQ, RESP = fork_reporter(lambda: libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM), pdeathsig)
elif VARIANT == 'attrs':
    # A worker whose process state differs from the runtime's: cwd, umask, a signal
    # handler, a blocked signal pending, an interval timer, a nice value, a name.
    HITS = []

    def setup():
        os.chdir('/tmp')
        os.umask(0o077)
        signal.signal(signal.SIGUSR1, lambda s, f: HITS.append(s))
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        os.kill(os.getpid(), signal.SIGUSR2)
        signal.setitimer(signal.ITIMER_VIRTUAL, 3600)
        os.nice(3)
        libc.prctl(15, b'worker-x')  # PR_SET_NAME

    def state():
        os.kill(os.getpid(), signal.SIGUSR1)
        return repr([os.getcwd(), os.umask(0o077), sorted(signal.sigpending()), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                     len(HITS), signal.getitimer(signal.ITIMER_VIRTUAL)[0] > 3000, os.nice(0), open('/proc/self/comm').read().strip()]).encode()
    PID, REQ, RESP = fork_reporter(setup, state)
    os.write(REQ, b'x')
    FIRST = os.read(RESP, 500)
elif VARIANT == 'socket_worker':
    A, B = socket.socketpair()
    PID = os.fork()
    if PID == 0:
        A.close()
        serve(lambda: B.recv(64), B.sendall, 's')
    B.close()
    A.sendall(b'1')
    FIRST = A.recv(200)
    # A reply left unread at the snapshot: queued on the runtime's end.
    A.sendall(b'2')
    time.sleep(0.2)
elif VARIANT == 'groups':
    GROUP = sleeper(lambda: os.setpgid(0, 0))
    os.setpgid(GROUP, GROUP)
    SESSION = sleeper(os.setsid)
    MEMBER = sleeper()
    os.setpgid(MEMBER, GROUP)
    time.sleep(0.2)
elif VARIANT == 'exec_cat':
    CAT = subprocess.Popen(['/bin/cat'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    CAT.stdin.write(b'one\n')
    CAT.stdin.flush()
    FIRST = CAT.stdout.readline()
elif VARIANT == 'threaded_child':
    PID, REQ, RESP = fork_pipe_worker('t', threaded=True)
    os.write(REQ, b'1')
    FIRST = os.read(RESP, 200)
elif VARIANT == 'mp_process':
    import multiprocessing
    ctx = multiprocessing.get_context('fork')
    CONN, THEIRS = ctx.Pipe()

    def work(conn):
        squares = {i: i * i for i in range(1000)}
        while True:
            k = conn.recv()
            if k is None:
                return
            conn.send((k, squares[k], os.getpid()))

    PROC = ctx.Process(target=work, args=(THEIRS,))
    PROC.start()
    CONN.send(3)
    FIRST = CONN.recv()
elif VARIANT == 'live_and_zombie':
    DEAD = os.fork()
    if DEAD == 0:
        os._exit(9)
    PID, REQ, RESP = fork_pipe_worker('z')
    time.sleep(0.2)
elif VARIANT == 'shared_end':
    # Two workers answering on one pipe, which the runtime and both hold.
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    PIDS = []
    for tag in ('a', 'b'):
        pid = os.fork()
        if pid == 0:
            os.close(req_w)
            os.close(resp_r)
            serve(lambda: os.read(req_r, 1), lambda b: os.write(resp_w, b), tag)
        PIDS.append(pid)
    os.close(req_r)
    REQ, RESP, RESP_W = req_w, resp_r, resp_w
elif VARIANT in ('shared_anon', 'shared_memfd'):
    # Memory the runtime and its worker share: the worker adds one to what the
    # runtime wrote and writes it beside.
    import mmap
    if VARIANT == 'shared_anon':
        SHM = mmap.mmap(-1, 4 * PAGE)
    else:
        mfd = os.memfd_create('shared')
        os.ftruncate(mfd, 4 * PAGE)
        SHM = mmap.mmap(mfd, 4 * PAGE)
        os.close(mfd)
    SHM[PAGE:PAGE + 5] = b'hello'
    REQ2_R, REQ2 = os.pipe()
    KID = os.fork()
    if KID == 0:
        os.close(REQ2)
        while os.read(REQ2_R, 1):
            SHM[8:16] = (int.from_bytes(SHM[0:8], 'little') + 1).to_bytes(8, 'little')
        os._exit(0)
    os.close(REQ2_R)
    SHM[0:8] = (41).to_bytes(8, 'little')
    os.write(REQ2, b'x')
    time.sleep(0.2)
elif VARIANT == 'mp_value':
    import multiprocessing
    ctx = multiprocessing.get_context('fork')
    COUNT = ctx.Value('i', 5)
    CONN, THEIRS = ctx.Pipe()

    def bump(conn, count):
        while conn.recv():
            with count.get_lock():
                count.value += 1
            conn.send(count.value)

    PROC = ctx.Process(target=bump, args=(THEIRS, COUNT))
    PROC.start()
    CONN.send(True)
    FIRST = CONN.recv()


def check():
    me = os.getpid()
    if VARIANT in ('pipe_worker', 'threaded_child', 'live_and_zombie'):
        tag = {'pipe_worker': 'w', 'threaded_child': 't', 'live_and_zombie': 'z'}[VARIANT]
        served = 1
        if VARIANT != 'live_and_zombie':
            expect(FIRST == reply(tag, 1, 1, PID), f'before the snapshot: {FIRST!r}')
            served = 2
        st = stat_of(PID)
        expect(st['ppid'] == me and st['pgrp'] == os.getpgid(0) and st['session'] == os.getsid(0), f'worker {PID}: {st}')
        os.write(REQ, b'42')
        got = os.read(RESP, 200)
        expect(got == reply(tag, 42, served, PID), f'worker answered {got!r}, expected {reply(tag, 42, served, PID)!r}')
        if VARIANT == 'live_and_zombie':
            p, status = os.waitpid(DEAD, os.WNOHANG)
            expect(p == DEAD and os.WEXITSTATUS(status) == 9, f'zombie {DEAD}: {p} {status}')
        os.close(REQ)
        p, status = os.waitpid(PID, 0)
        expect(p == PID and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f'worker ended with {status}')
    elif VARIANT == 'pdeathsig':
        os.write(REQ, b'x')
        got = int(os.read(RESP, 10))
        expect(got == signal.SIGTERM, f'the worker has parent-death signal {got}')
        os.close(REQ)
        os.waitpid(PID, 0)
    elif VARIANT == 'attrs':
        want = lambda hits: repr(['/tmp', 0o077, [signal.SIGUSR2], [signal.SIGUSR2], hits, True, 3, 'worker-x']).encode()
        expect(FIRST == want(1), f'before the snapshot: {FIRST!r}')
        os.write(REQ, b'x')
        got = os.read(RESP, 500)
        expect(got == want(2), f'the worker reports {got!r}, expected {want(2)!r}')
        os.close(REQ)
        os.waitpid(PID, 0)
    elif VARIANT == 'socket_worker':
        expect(FIRST == reply('s', 1, 1, PID), f'before the snapshot: {FIRST!r}')
        got = A.recv(200)
        expect(got == reply('s', 2, 2, PID), f'the reply queued at the snapshot: {got!r}')
        A.sendall(b'42')
        got = A.recv(200)
        expect(got == reply('s', 42, 3, PID), f'after the restore: {got!r}')
        A.shutdown(socket.SHUT_WR)
        p, status = os.waitpid(PID, 0)
        expect(p == PID and os.WEXITSTATUS(status) == 0, f'worker ended with {status}')
    elif VARIANT == 'groups':
        expect(os.getpgid(GROUP) == GROUP and os.getsid(GROUP) == os.getsid(0), f'group leader {GROUP}: {stat_of(GROUP)}')
        expect(os.getsid(SESSION) == SESSION and os.getpgid(SESSION) == SESSION, f'session leader {SESSION}: {stat_of(SESSION)}')
        expect(os.getpgid(MEMBER) == GROUP and os.getsid(MEMBER) == os.getsid(0), f'member {MEMBER}: {stat_of(MEMBER)}')
        for pid in (GROUP, SESSION, MEMBER):
            expect(stat_of(pid)['ppid'] == me, f'{pid} is not a child of the runtime: {stat_of(pid)}')
        os.killpg(GROUP, signal.SIGTERM)
        for pid in (GROUP, MEMBER):
            p, status = os.waitpid(pid, 0)
            expect(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, f'{pid} was not in the group: {status}')
        os.kill(SESSION, signal.SIGKILL)
        os.waitpid(SESSION, 0)
    elif VARIANT == 'exec_cat':
        expect(FIRST == b'one\n', f'before the snapshot: {FIRST!r}')
        with open(f'/proc/{CAT.pid}/cmdline', 'rb') as f:
            expect(f.read() == b'/bin/cat\0', f'process {CAT.pid} is not cat')
        CAT.stdin.write(b'two\n')
        CAT.stdin.flush()
        got = CAT.stdout.readline()
        expect(got == b'two\n', f'cat answered {got!r}')
        CAT.stdin.close()
        expect(CAT.wait(timeout=10) == 0, 'cat did not end cleanly')
    elif VARIANT == 'mp_process':
        expect(FIRST == (3, 9, PROC.pid), f'before the snapshot: {FIRST!r}')
        expect(PROC.is_alive(), 'the worker process is not alive')
        CONN.send(31)
        got = CONN.recv()
        expect(got == (31, 961, PROC.pid), f'worker answered {got!r}')
        CONN.send(None)
        PROC.join(10)
        expect(PROC.exitcode == 0, f'worker exit code {PROC.exitcode}')
    elif VARIANT == 'shared_end':
        answers = set()
        for k in range(6):
            os.write(REQ, b'%d' % k)
            got = os.read(RESP, 200).decode()
            tag, key = got.split(':')[:2]
            expect(int(key) == k and tag in ('a', 'b'), f'answer {got!r}')
            answers.add(tag)
        os.close(REQ)
        for pid in PIDS:
            p, status = os.waitpid(pid, 0)
            expect(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f'worker {pid} ended with {status}')
    elif VARIANT in ('shared_anon', 'shared_memfd'):
        expect(int.from_bytes(SHM[8:16], 'little') == 42, f'before the snapshot the worker wrote {SHM[8:16]!r}')
        expect(SHM[PAGE:PAGE + 5] == b'hello', 'the shared memory lost its contents')
        SHM[0:8] = (99).to_bytes(8, 'little')
        os.write(REQ2, b'x')
        deadline = time.time() + 5
        while int.from_bytes(SHM[8:16], 'little') != 100 and time.time() < deadline:
            time.sleep(0.01)
        expect(int.from_bytes(SHM[8:16], 'little') == 100, f'the worker did not see the runtime write: {SHM[8:16]!r}')
        os.close(REQ2)
        for pid in (KID,):
            p, status = os.waitpid(pid, 0)
            expect(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f'worker {pid} ended with {status}')
    elif VARIANT == 'mp_value':
        expect(FIRST == 6, f'before the snapshot: {FIRST!r}')
        with COUNT.get_lock():
            COUNT.value += 10
        CONN.send(True)
        got = CONN.recv()
        expect(got == 17 and COUNT.value == 17, f'the worker counted {got}, the runtime sees {COUNT.value}')
        CONN.send(False)
        PROC.join(10)
        expect(PROC.exitcode == 0, f'worker exit code {PROC.exitcode}')
