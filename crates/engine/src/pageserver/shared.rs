//! A fixed set of page-server threads shared by every instance of the process (issue
//! #33): a node with 500 idle instances had 500 page-server threads, one blocked in
//! poll(2) per instance. Now a few workers (at most 2 per core, 2 to 16;
//! `THAW_PAGESERVER_THREADS`; started as instances come) each wait in epoll on the
//! userfaultfds of the instances given to them (an instance and the children it forks
//! stay on one worker: their servers share the instance's state) and on those
//! instances' pidfds. `THAW_PAGESERVER=thread` gives every instance its own
//! thread again (the baseline of the comparison).
//!
//! Per instance, nothing changes in what is served or how (see [`Serve`]): the address
//! space and its reset epochs, read-around windows, the working-set trace, CPU
//! accounting. Only the waiting is shared:
//! - after serving, a worker keeps polling its descriptors without sleeping for the
//!   spin time (`THAW_PAGESERVER_SPIN_US`), as the per-instance thread did (a sleep and
//!   wake-up costs more than a fault);
//! - one pass over an instance reads at most a batch of its events, so a busy instance
//!   cannot keep a worker from the others;
//! - an instance whose fault budget is spent is taken out of the epoll set until its
//!   deficit is paid back (a timer in the worker's loop): its faulting threads wait,
//!   the worker serves the others meanwhile;
//! - a forked child's server is an entry of the same worker, probed every [`CHILD_PROBE`]
//!   and dropped when the child's address space is gone;
//! - an instance that cannot be served is killed (as before); a panic while serving one
//!   instance kills that instance, never the worker.
//!
//! `epoll` rather than io_uring or a crate's event loop: a handful of descriptors per
//! worker and blocking page reads in between, which is what a plain epoll loop does
//! best; nix already wraps the calls safely.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tracing::{debug, error, warn};

use super::{spin, thread_cpu_ns, PageServerError, Serve, Step, CHILD_PROBE, PAGE_SIZE};

/// The shared workers (started as instances need them); `None` when
/// `THAW_PAGESERVER=thread` asks for a thread per instance.
pub(crate) fn pool() -> Option<&'static Pool> {
    POOL.get_or_init(|| {
        if std::env::var("THAW_PAGESERVER").is_ok_and(|v| v == "thread") {
            return None;
        }
        Some(Pool { max: workers_wanted(), workers: Mutex::new(Vec::new()) })
    })
    .as_ref()
}

/// How many shared workers at most: `THAW_PAGESERVER_THREADS`, else two per core, 2 to
/// 16 (a page read from disk or from the store blocks its worker; two per core keeps a
/// core busy meanwhile).
fn workers_wanted() -> usize {
    if let Some(n) = std::env::var("THAW_PAGESERVER_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        return n.clamp(1, 64);
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (2 * cores).clamp(2, 16)
}

static POOL: OnceLock<Option<Pool>> = OnceLock::new();

/// How many shared page-server threads run (0 before the first restore, and when each
/// instance has its own).
pub fn threads() -> usize {
    POOL.get().and_then(Option::as_ref).map_or(0, |p| p.workers.lock().expect("page-server pool lock").len())
}

/// The workers, started one at a time: a new instance gets a worker of its own while
/// fewer than `max` run, else it joins the one with the fewest instances. A one-shot
/// restore (the CLI) starts one thread, not one per core (each costs ~0.1 ms here).
pub struct Pool {
    max: usize,
    workers: Mutex<Vec<Arc<Worker>>>,
}

impl Pool {
    fn start_worker(index: usize) -> io::Result<Arc<Worker>> {
        let w = Arc::new(Worker {
            cmds: Mutex::new(Vec::new()),
            wake: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).map_err(io::Error::from)?,
            instances: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
        });
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
        epoll.add(w.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE)).map_err(io::Error::from)?;
        let worker = w.clone();
        std::thread::Builder::new().name("thaw-pageserver".into()).spawn(move || {
            let _alive = AliveGuard(worker.clone());
            Loop::new(epoll, worker).run();
        })?;
        debug!(worker = index, "shared page-server thread started");
        Ok(w)
    }

    /// Serve `serve` on a worker: a new one while fewer than `max` run and each has an
    /// instance, else the one with the fewest instances.
    pub(crate) fn add(&self, serve: Serve) -> io::Result<Registration> {
        static GROUPS: AtomicU64 = AtomicU64::new(1);
        let mut workers = self.workers.lock().expect("page-server pool lock");
        let worker = {
            workers.retain(|w| w.alive.load(Ordering::Acquire));
            let least = workers.iter().min_by_key(|w| w.instances.load(Ordering::Relaxed)).cloned();
            match least {
                Some(w) if w.instances.load(Ordering::Relaxed) == 0 || workers.len() >= self.max => w,
                _ => match Self::start_worker(workers.len()) {
                    Ok(w) => {
                        workers.push(w.clone());
                        w
                    }
                    // One more thread could not start: the running ones serve it.
                    Err(e) => match least {
                        Some(w) => {
                            warn!(error = %e, "starting another page-server thread failed; sharing a running one");
                            w
                        }
                        None => return Err(e),
                    },
                },
            }
        };
        // Counted under the lock: the next add sees it.
        worker.instances.fetch_add(1, Ordering::Relaxed);
        drop(workers);
        let group = GROUPS.fetch_add(1, Ordering::Relaxed);
        worker.send(Cmd::Add { group, serve });
        Ok(Registration { worker, group })
    }
}

/// One instance on a shared worker; [`Registration::remove`] ends its service.
pub(crate) struct Registration {
    worker: Arc<Worker>,
    group: u64,
}

impl Registration {
    /// Stop serving the instance and its children and close their userfaultfds; returns
    /// when the worker has done so (or has ended).
    pub(crate) fn remove(self) {
        let (tx, rx) = mpsc::sync_channel(1);
        self.worker.send(Cmd::Remove { group: self.group, done: tx });
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) if !self.worker.alive.load(Ordering::Acquire) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

struct Worker {
    cmds: Mutex<Vec<Cmd>>,
    wake: EventFd,
    /// Instances (not counting their children) this worker serves: where the next goes.
    instances: AtomicUsize,
    alive: AtomicBool,
}

impl Worker {
    fn send(&self, cmd: Cmd) {
        self.cmds.lock().expect("page-server command lock").push(cmd);
        let _ = self.wake.write(1);
    }
}

/// Marks the worker ended however its thread ends.
struct AliveGuard(Arc<Worker>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
        error!("a shared page-server thread ended");
    }
}

enum Cmd {
    Add { group: u64, serve: Serve },
    Remove { group: u64, done: mpsc::SyncSender<()> },
}

/// While spinning, how often the epoll set is asked (the other turns read the entry
/// served last directly).
const EPOLL_EVERY: u32 = 8;

/// epoll tokens: the wake-up eventfd; an entry's userfaultfd (`id << 1`); an
/// instance's pidfd (`group << 1 | 1`).
const WAKE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The entry's fault budget allows serving it again.
    Resume,
    /// Check that a forked child's address space still exists.
    Probe,
}

struct Entry {
    serve: Serve,
    group: u64,
    /// Out of the epoll set since then, held back by the fault budget.
    held_since: Option<Instant>,
}

struct Group {
    pidfd: Arc<OwnedFd>,
    entries: Vec<u64>,
}

struct Loop {
    epoll: Epoll,
    worker: Arc<Worker>,
    entries: HashMap<u64, Entry>,
    groups: HashMap<u64, Group>,
    timers: BinaryHeap<Reverse<(Instant, u64, Timer)>>,
    next_id: u64,
    buf: Vec<u8>,
    forks: Vec<Serve>,
    /// The entry this thread's CPU time is being charged to since its mark. The clock is
    /// read when the worker turns to another entry or goes to sleep (and by [`Serve::drain`]
    /// every few faults), not at every pass: reading it is a system call, and a lazy
    /// restore's faults come one pass each.
    charging: Option<u64>,
}

impl Loop {
    fn new(epoll: Epoll, worker: Arc<Worker>) -> Loop {
        Loop {
            epoll,
            worker,
            entries: HashMap::new(),
            groups: HashMap::new(),
            timers: BinaryHeap::new(),
            next_id: 1,
            buf: Vec::with_capacity(32 * PAGE_SIZE as usize),
            forks: Vec::new(),
            charging: None,
        }
    }

    fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); 64];
        // Until then the worker polls without sleeping (see the module's doc).
        let mut spin_until: Option<Instant> = None;
        // While spinning, the entry served last is read directly, and the epoll set is
        // asked only every few turns: a fault of the one instance that is faulting (a
        // lazy restore's stream) then costs one read, as on a thread of its own.
        let (mut last, mut turn) = (None::<u64>, 0u32);
        loop {
            if let Some(id) = last.filter(|_| spin_until.is_some() && turn % EPOLL_EVERY != 0) {
                turn += 1;
                if self.serve(id) {
                    spin_until = Some(Instant::now() + spin());
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            turn = 1;
            let timeout = if spin_until.is_some() { EpollTimeout::ZERO } else { self.next_timeout() };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    error!(error = %e, "epoll_wait in a shared page-server thread failed");
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            let mut served = false;
            for ev in &events[..n] {
                match ev.data() {
                    WAKE => self.commands(),
                    t if t & 1 == 1 => {
                        debug!(group = t >> 1, "instance exited; its page server ends");
                        self.remove_group(t >> 1);
                    }
                    t => {
                        if self.serve(t >> 1) {
                            served = true;
                            last = Some(t >> 1);
                        }
                    }
                }
            }
            served |= self.due_timers();
            let now = Instant::now();
            if served {
                spin_until = Some(now + spin());
            } else if spin_until.is_some_and(|u| now > u) {
                spin_until = None;
                last = None;
                self.charge_current(None);
            } else if spin_until.is_some() {
                std::hint::spin_loop();
            }
        }
    }

    /// Until the next timer (none: indefinitely).
    fn next_timeout(&self) -> EpollTimeout {
        match self.timers.peek() {
            None => EpollTimeout::NONE,
            Some(Reverse((at, _, _))) => {
                // Rounded up: a timer is never served early.
                let ms = at.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000);
                EpollTimeout::try_from(ms.min(60_000) as u64).unwrap_or(EpollTimeout::MAX)
            }
        }
    }

    fn commands(&mut self) {
        let _ = self.worker.wake.read();
        let cmds = std::mem::take(&mut *self.worker.cmds.lock().expect("page-server command lock"));
        for cmd in cmds {
            match cmd {
                Cmd::Add { group, serve } => {
                    let pidfd = serve.pidfd.clone();
                    if let Err(e) = self.epoll.add(pidfd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, group << 1 | 1)) {
                        serve.fail(&PageServerError::Poll(e.into()));
                        self.worker.instances.fetch_sub(1, Ordering::Relaxed);
                        continue;
                    }
                    self.groups.insert(group, Group { pidfd, entries: Vec::new() });
                    if self.add_entry(group, serve) {
                        // Events may already wait (the process runs once its restore returns).
                        self.serve_all_of(group);
                    }
                }
                Cmd::Remove { group, done } => {
                    self.remove_group(group);
                    let _ = done.send(());
                }
            }
        }
    }

    /// Register `serve` as an entry of `group`; false (and the instance killed) if its
    /// userfaultfd cannot be watched.
    fn add_entry(&mut self, group: u64, serve: Serve) -> bool {
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.epoll.add(serve.uffd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, id << 1)) {
            serve.fail(&PageServerError::Poll(e.into()));
            self.remove_group(group);
            return false;
        }
        if serve.child {
            self.timers.push(Reverse((Instant::now() + CHILD_PROBE, id, Timer::Probe)));
        }
        self.groups.get_mut(&group).expect("group of a new entry").entries.push(id);
        self.entries.insert(id, Entry { serve, group, held_since: None });
        true
    }

    fn serve_all_of(&mut self, group: u64) {
        let ids = self.groups.get(&group).map(|g| g.entries.clone()).unwrap_or_default();
        for id in ids {
            self.serve(id);
        }
    }

    /// Charge the CPU time since its mark to the entry being charged, and charge `next`
    /// from now on (None: nobody, the worker is going to sleep). A budget found spent here
    /// holds the entry back at its next fault charge (as a thread of its own would: it
    /// charges every few faults and when it goes to sleep).
    fn charge_current(&mut self, next: Option<u64>) {
        if self.charging == next {
            return;
        }
        let now = thread_cpu_ns();
        if let Some(e) = self.charging.and_then(|id| self.entries.get_mut(&id)) {
            let _ = e.serve.charge_until(now);
        }
        if let Some(e) = next.and_then(|id| self.entries.get_mut(&id)) {
            e.serve.mark_cpu(now);
        }
        self.charging = next;
    }

    /// One pass over entry `id`; true if it served anything.
    fn serve(&mut self, id: u64) -> bool {
        if self.entries.get(&id).is_none_or(|e| e.held_since.is_some()) {
            return false;
        }
        self.charge_current(Some(id));
        let e = self.entries.get_mut(&id).expect("checked above");
        let (buf, forks) = (&mut self.buf, &mut self.forks);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.serve.drain(buf, forks)))
            .unwrap_or_else(|_| Err(PageServerError::Poll(io::Error::other("page server panicked"))));
        let group = e.group;
        let step = match r {
            Ok(step) => step,
            Err(err) => {
                e.serve.fail(&err);
                // Children it forked during the failed pass die with it: their servers
                // must not be left for the next entry served (another instance's group).
                self.forks.clear();
                self.remove_group(group);
                return true;
            }
        };
        if let Step::Throttled(wait) = step {
            let _ = self.epoll.delete(e.serve.uffd.as_fd());
            let now = Instant::now();
            e.held_since = Some(now);
            self.timers.push(Reverse((now + wait, id, Timer::Resume)));
        }
        for child in std::mem::take(&mut self.forks) {
            if !self.add_entry(group, child) {
                return true;
            }
        }
        step != Step::Idle
    }

    /// Run the timers that are due; true if serving an entry again served anything.
    fn due_timers(&mut self) -> bool {
        let mut served = false;
        let now = Instant::now();
        while let Some(Reverse((at, id, kind))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.entries.get_mut(&id) else { continue };
            match kind {
                Timer::Resume => {
                    let Some(since) = e.held_since.take() else { continue };
                    e.serve.stats.throttled_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    if let Err(err) = self.epoll.add(e.serve.uffd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, id << 1)) {
                        e.serve.fail(&PageServerError::Poll(err.into()));
                        let g = e.group;
                        self.remove_group(g);
                        continue;
                    }
                    // What was queued when it was held back is served now.
                    served |= self.serve(id);
                }
                Timer::Probe => {
                    if e.serve.child_gone() {
                        debug!("forked child is gone; its page server ends");
                        let g = e.group;
                        self.remove_entry(id);
                        if let Some(g) = self.groups.get_mut(&g) {
                            g.entries.retain(|x| *x != id);
                        }
                    } else {
                        self.timers.push(Reverse((now + CHILD_PROBE, id, Timer::Probe)));
                    }
                }
            }
        }
        served
    }

    /// Forget entry `id`: out of the epoll set, its CPU charged, its userfaultfd closed.
    fn remove_entry(&mut self, id: u64) {
        if self.charging == Some(id) {
            self.charge_current(None);
        }
        if let Some(e) = self.entries.remove(&id) {
            if e.held_since.is_none() {
                let _ = self.epoll.delete(e.serve.uffd.as_fd());
            }
        }
    }

    fn remove_group(&mut self, group: u64) {
        let Some(g) = self.groups.remove(&group) else { return };
        for id in g.entries {
            self.remove_entry(id);
        }
        let _ = self.epoll.delete(g.pidfd.as_fd());
        self.worker.instances.fetch_sub(1, Ordering::Relaxed);
    }
}
