//! The on-disk snapshot image.
//!
//! A snapshot is a directory:
//! ```text
//! SNAPDIR/
//!   state.bin   process state: registers, memory map, page index, descriptors...
//!   pages.img   raw page contents, page aligned, in the order of the page index
//! ```
//! `state.bin` is framed so that truncation and corruption are detected before
//! anything is parsed:
//! ```text
//! +0   magic   "THAWIMG\0"           8 bytes
//! +8   version u32 LE (FORMAT_VERSION)
//! +12  length  u64 LE of the payload (capped at MAX_STATE_LEN)
//! +20  payload bincode(ProcessImage)
//! +N   crc32   u32 LE over bytes [0, 20+length)
//! ```
//! `pages.img` is too large to checksum on every restore (lazy restores must not
//! read it all), so the index carries one CRC32 per stored page and the page
//! server verifies each page when it reads it. Its size must equal
//! `4096 * stored pages`, which catches truncation up front.
//!
//! Pages absent from the index are pages the process never touched (or that were
//! entirely zero): they are served as zero pages.
//!
//! A *sealed* image (captured by a process holding a node key, see `seal.rs`) has
//! every stored page encrypted in place with AES-256-GCM, its tag in
//! `PageIndex::tags`, and its captured /tmp file contents and its descriptors'
//! payloads ([`ProcessImage::fd_payloads_mut`], format 24) encrypted in `state.bin`;
//! `ProcessImage::seal` names the key. The CRCs cover the stored (sealed) bytes.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::procfs::MmFields;
use crate::sys::PAGE_SIZE;

pub const MAGIC: &[u8; 8] = b"THAWIMG\0";
/// Bump on any change to [`ProcessImage`] or the file layout.
pub const FORMAT_VERSION: u32 = 24;
pub const MAX_STATE_LEN: u64 = 256 << 20;
pub const STATE_FILE: &str = "state.bin";
pub const PAGES_FILE: &str = "pages.img";
const HEADER_LEN: usize = 20;

#[derive(Debug, Error)]
pub enum ImageError {
    #[error("snapshot {dir}: cannot read {file}")]
    Io { dir: PathBuf, file: &'static str, #[source] source: io::Error },
    #[error("snapshot {dir}: {file} is not a Thaw image (bad magic)")]
    BadMagic { dir: PathBuf, file: &'static str },
    #[error("snapshot {dir}: format version {found} is not supported (this build reads version {FORMAT_VERSION})")]
    Version { dir: PathBuf, found: u32 },
    #[error("snapshot {dir}: {file} is truncated or corrupt ({detail})")]
    Corrupt { dir: PathBuf, file: &'static str, detail: String },
    #[error("snapshot {dir}: cannot write {file}")]
    Write { dir: PathBuf, file: String, #[source] source: io::Error },
    #[error("snapshot {dir} already exists")]
    Exists { dir: PathBuf },
    #[error("snapshot {dir} cannot be opened")]
    Sealed { dir: PathBuf, #[source] source: crate::seal::OpenError },
    #[error("snapshot {dir}: {what} does not authenticate under the node key (tampered with or corrupt)")]
    Forged { dir: PathBuf, what: String },
    #[error("snapshot {dir}: cannot seal it")]
    Seal { dir: PathBuf, #[source] source: crate::seal::SealError },
}

/// How the node recreates the sandbox the process lived in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub runtime: String,
    pub handler: String,
    pub code_dir: PathBuf,
    pub runtime_dir: Option<PathBuf>,
    /// The function's layers, extracted in order (mounted at `/opt`); `None`: no layers.
    pub opt_dir: Option<PathBuf>,
    pub memory_mb: u64,
    pub cpu_millis: u64,
    pub pids_max: u64,
    pub tmp_size_mb: u64,
    pub uid: u32,
    pub gid: u32,
    /// The runtime asked to be told when it is a restored clone (to reseed
    /// randomness, run after-restore hooks).
    pub restore_notice: bool,
    /// Fingerprint of `code_dir` and `opt_dir` at capture (see `fingerprint`); a
    /// restore over a changed bundle is refused.
    pub code_fingerprint: String,
}

/// General purpose registers in `user_regs_struct` order.
pub type RegsArray = [u64; 27];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rseq {
    pub ptr: u64,
    pub len: u32,
    pub sig: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AltStack {
    pub sp: u64,
    pub flags: i32,
    pub size: u64,
}

/// Per-thread state; the thread group leader (tid 1) comes first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadState {
    /// Thread id inside the sandbox's pid namespace.
    pub tid: i32,
    pub regs: RegsArray,
    pub xstate: Vec<u8>,
    pub sigmask: u64,
    pub rseq: Option<Rseq>,
    pub robust_list: (u64, u64),
    pub tid_address: u64,
    pub altstack: Option<AltStack>,
    /// Thread name.
    pub comm: String,
    /// Signals queued for this thread alone (tgkill, pthread_kill) and not delivered
    /// at capture, in queue order.
    pub pending: Vec<PendingSignal>,
    /// Its scheduling policy (SCHED_OTHER 0, SCHED_BATCH 3, SCHED_IDLE 5; format 19).
    pub sched_policy: i32,
}

/// A signal queued and not yet delivered (typically blocked), as `PTRACE_PEEKSIGINFO`
/// read it: queued again at restore with its information unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSignal {
    pub signo: i32,
    /// The kernel's siginfo_t (128 bytes): sender, code, value.
    pub info: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigAction {
    pub sig: u32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

impl SigAction {
    /// The kernel's struct sigaction: handler, flags, restorer, mask.
    pub fn words(&self) -> [u64; 4] {
        [self.handler, self.flags, self.restorer, self.mask]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmState {
    pub fields: MmFields,
    pub brk: u64,
    pub auxv: Vec<u8>,
    /// Path of the executable inside the sandbox.
    pub exe: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creds {
    pub uid: [u32; 3],
    pub gid: [u32; 3],
    pub groups: Vec<u32>,
}

/// A file the image depends on, with what it looked like at capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Path inside the sandbox.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileRef {
    /// The file at `path` (inside the sandbox) as `meta` shows it now.
    pub fn of(path: &str, meta: &std::fs::Metadata) -> FileRef {
        use std::os::unix::fs::MetadataExt;
        FileRef { path: path.to_string(), size: meta.len(), mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128 }
    }

    /// Whether `meta` shows the file as it was at capture (size and modification time).
    pub fn unchanged(&self, meta: &std::fs::Metadata) -> bool {
        FileRef::of(&self.path, meta) == *self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmaKind {
    /// Private anonymous memory (heap, stack, arenas), served by the page server.
    Anon { growsdown: bool },
    /// Private file mapping; copy-on-written pages are stored in the image.
    FilePrivate { file: usize, offset: u64 },
    /// Private file mapping the process had mostly written (a relocated CDS
    /// archive, relocation-read-only and .data segments): its whole contents are in
    /// the image and it is restored as anonymous memory served by the page
    /// server, so only the pages an instance touches are ever read or copied.
    FileCopied { file: usize, offset: u64 },
    /// Read-only shared file mapping, mapped again from the file.
    FileShared { file: usize, offset: u64 },
    /// Kernel-provided mapping moved into place (`[vdso]`, `[vvar]`, `[vvar_vclock]`).
    Special { name: String },
    /// Shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS, shown as "/dev/zero
    /// (deleted)"), stored whole: mapped again shared and anonymous, its contents
    /// written before the process resumes (not served by the page server: a fault in
    /// shared memory is not one a private registration sees). Shared with the
    /// instance's threads; an instance has no other process to share it with
    /// (other processes are refused). Appended last: older images decode as before.
    SharedAnon,
    /// A mapping of an object no path reaches: a memfd, or a file of the instance's
    /// own /tmp or /dev/shm deleted since it was mapped. Mapped again from descriptor
    /// `fd` once the descriptors are restored: a `MemFd` or `DeletedTmp` the process
    /// holds of the same object, or an [`FdKind::MapOnly`] made for its mappings. The
    /// object's contents travel with that descriptor; a private mapping's
    /// copy-on-written pages are stored in the image, as a `FilePrivate`'s.
    /// (Appended last.)
    Unlinked { fd: i32, offset: u64, shared: bool },
}

/// The SOL_SOCKET options of a socketpair end carried across a snapshot, with the
/// size of their value: whether credentials and security labels are passed with
/// each message, the buffer sizes (getsockopt gives the doubled value the kernel
/// keeps; setting half of it gives it back), the receive and send timeouts
/// (struct timeval), the peek offset, the receive low-water mark, and whether a
/// received message carries its time.
pub const SOCKET_OPTIONS: [(i32, usize); 10] = [
    (libc::SO_PASSCRED, 4),
    (libc::SO_PASSSEC, 4),
    (libc::SO_RCVBUF, 4),
    (libc::SO_SNDBUF, 4),
    (libc::SO_RCVTIMEO, 16),
    (libc::SO_SNDTIMEO, 16),
    (libc::SO_PEEK_OFF, 4),
    (libc::SO_RCVLOWAT, 4),
    (libc::SO_TIMESTAMP, 4),
    (libc::SO_TIMESTAMPNS, 4),
];

/// Shared anonymous memory larger than this is refused at capture (it is stored
/// whole and written before the process resumes).
pub const MAX_SHARED_ANON: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// PROT_* bits.
    pub prot: i32,
    pub kind: VmaKind,
    /// madvise() advice set again after the mapping is recreated (MADV_DONTFORK,
    /// MADV_WIPEONFORK, MADV_(NO)HUGEPAGE): VMA flags the mapping itself does not carry;
    /// and [`ADVICE_MLOCK`].
    pub advice: Vec<i32>,
}

/// In [`Vma::advice`], not a madvise() advice: the mapping was locked (mlock, VmFlags
/// `lo`). The restore locks it again with mlock2(MLOCK_ONFAULT): its pages are locked
/// as they arrive (from the page server, or a prefetch) instead of all being faulted
/// in during the restore. A process locked with mlockall(MCL_FUTURE) is not seen as
/// such (no VMA flag records it): its existing mappings are locked again, its future
/// ones are not.
pub const ADVICE_MLOCK: i32 = -1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FdKind {
    /// fd 0: /dev/null, recreated by the sandbox.
    Null,
    /// fd 1/2: the log pipe, recreated by the sandbox.
    Log,
    /// fd 3: the control channel, recreated by the sandbox.
    Control,
    /// A file or character device reopened by path.
    Path { path: String, flags: i32, pos: u64 },
    /// One end of a pipe whose both ends the process holds, or whose other end is
    /// closed (`pipe` identifies the pair); a read end carries the bytes that were
    /// buffered in the pipe; `size` is its capacity (F_GETPIPE_SZ, format 19).
    Pipe { pipe: u64, write: bool, flags: i32, buffered: Vec<u8>, size: u32 },
    /// An eventfd with its counter.
    EventFd { count: u64, semaphore: bool, flags: i32 },
    /// A timerfd: its clock, expirations not yet read, and what was left of its
    /// current period at capture (re-armed relative, like the interval timers) and
    /// its interval, as (seconds, nanoseconds).
    TimerFd { clockid: i32, flags: i32, ticks: u64, value: (i64, i64), interval: (i64, i64) },
    /// An epoll instance and its registrations (target fd, events, data).
    Epoll { flags: i32, items: Vec<(i32, u32, u64)> },
    /// A signalfd and the signals it accepts.
    SignalFd { mask: u64, flags: i32 },
    /// A descriptor sharing one open file description (offset, status flags) with
    /// descriptor `of` (dup/dup2 of it); `flags` carries its own O_CLOEXEC.
    Dup { of: i32, flags: i32 },
    /// One end of a unix socketpair whose both ends the process holds (`pair`
    /// identifies it; `first` is the end socketpair(2) returns first). `queued` is
    /// what was waiting to be read on this end (one entry per message; one for a
    /// stream), sent again from the other end at restore; `shutdown` the
    /// RCV_SHUTDOWN (1) / SEND_SHUTDOWN (2) bits of this end; `options` the socket
    /// options set again before anything is sent ([`SOCKET_OPTIONS`]: option and
    /// its value as getsockopt gave it; format 19).
    SocketPair { pair: u64, first: bool, sock_type: i32, flags: i32, shutdown: u8, queued: Vec<Vec<u8>>, options: Vec<(i32, Vec<u8>)> },
    /// A memfd (memfd_create) only held open, not mapped: its name, its whole
    /// contents (its size is their length), its seals (F_GET_SEALS), offset and flags.
    /// (Appended last: the variants before keep their numbers in older images.)
    MemFd { name: String, content: Vec<u8>, seals: u32, flags: i32, pos: u64 },
    /// A file of the instance's own /tmp or /dev/shm, open and then deleted: its path
    /// (free again at capture), its whole contents, mode, flags and offset; made again
    /// at that path, opened, unlinked. (Appended last, as MemFd.)
    DeletedTmp { path: String, content: Vec<u8>, mode: u32, flags: i32, pos: u64 },
    /// A pidfd of the process itself (pidfd_open(getpid())), opened again by the
    /// restored process. (Appended last.)
    PidFdSelf { flags: i32 },
    /// A file of the instance's own /tmp or /dev/shm reopened by path (as `Path`) on
    /// which the process holds file locks, taken again once it is at its number.
    /// (Appended last.)
    PathLocked { path: String, flags: i32, pos: u64, locks: Vec<FileLock> },
    /// Not one of the process's descriptors: a memfd or deleted /tmp file it maps
    /// but holds no descriptor of. `object` (a `MemFd` or `DeletedTmp`) is made at
    /// this number, otherwise unused, for its mappings ([`VmaKind::Unlinked`]) and
    /// closed once they are made. (Appended last.)
    MapOnly { object: Box<FdKind> },
    /// An inotify instance (inotify_init1 `flags`) and its watches, added again by
    /// path in watch descriptor order, and the events queued on it at capture, in
    /// order (caused again at restore: restore/inotify.rs; format 19). (Appended
    /// last.)
    Inotify { flags: i32, watches: Vec<InotifyWatch>, queued: Vec<InotifyEvent> },
    /// Not one of the process's descriptors: a descriptor in flight, passed
    /// (SCM_RIGHTS) with a queued message and not received at the snapshot. `sends`:
    /// (socketpair end, message index on it, place among the message's descriptors)
    /// of the time it was passed. `object` (any kind but another `InFlight`; a `Dup`
    /// where its open file is also a descriptor of the process or was passed
    /// before it, format 19) is made at this number, otherwise unused, sent again
    /// with that message, and closed. (Appended last.)
    InFlight { sends: Vec<(i32, u32, u32)>, object: Box<FdKind> },
}

/// One watch of an inotify instance: its watch descriptor, the path (in the instance)
/// of what it watches, and its mask (IN_* events and flags, as fdinfo gives it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyWatch {
    pub wd: i32,
    pub path: String,
    pub mask: u32,
}

/// An event queued on an inotify instance at capture, as read(2) gave it: the watch
/// descriptor, the mask (one event, or `IN_MOVED_FROM` / `IN_MOVED_TO` of one
/// rename, with `IN_ISDIR`), the cookie pairing a rename's two events, and the name
/// of the entry in a watched directory (empty for an event on the watched object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InotifyEvent {
    pub wd: i32,
    pub mask: u32,
    pub cookie: u32,
    pub name: Vec<u8>,
}

/// A file lock a descriptor holds (fdinfo's `lock:` lines, as /proc/locks prints them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    pub kind: LockKind,
    pub write: bool,
    pub start: u64,
    /// 0: to the end of the file, however it grows.
    pub len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    /// flock(2): of the open file description.
    Flock,
    /// fcntl(F_SETLK): of the process.
    Posix,
    /// fcntl(F_OFD_SETLK): of the open file description.
    Ofd,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdRecord {
    pub fd: i32,
    pub kind: FdKind,
}

/// A run of consecutive virtual pages stored consecutively in pages.img.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageRun {
    pub vaddr: u64,
    pub npages: u64,
    /// Index of the run's first page in pages.img.
    pub file_page: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageIndex {
    /// Sorted by vaddr, non-overlapping.
    pub runs: Vec<PageRun>,
    /// CRC32 of each stored page (the bytes in pages.img), indexed by file page.
    pub crcs: Vec<u32>,
    /// GCM tag of each stored page of a sealed image (empty otherwise). Stored as one
    /// byte string (format 23, [`flat_tags`]).
    #[serde(with = "flat_tags")]
    pub tags: Vec<[u8; crate::seal::TAG_LEN]>,
}

/// [`PageIndex::tags`] as one byte string of 16 bytes a tag, where bincode's own
/// encoding of a `Vec<[u8; 16]>` decodes every byte of every tag as a tuple element:
/// that took 0.59 ms of a sealed lrserving's open (16,814 tags, 0.67 ms against 0.08
/// for its clear state.bin), on every restore's path; a byte string is one copy.
mod flat_tags {
    use crate::seal::TAG_LEN;
    use serde::{de, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(tags: &[[u8; TAG_LEN]], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(tags.as_flattened())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<[u8; TAG_LEN]>, D::Error> {
        struct Tags;
        impl de::Visitor<'_> for Tags {
            type Value = Vec<[u8; TAG_LEN]>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "page tags of {TAG_LEN} bytes each, as one byte string")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                if !v.len().is_multiple_of(TAG_LEN) {
                    return Err(E::invalid_length(v.len(), &self));
                }
                Ok(v.chunks_exact(TAG_LEN).map(|t| t.try_into().expect("TAG_LEN bytes")).collect())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
                self.visit_bytes(&v)
            }
        }
        d.deserialize_byte_buf(Tags)
    }
}

impl PageIndex {
    pub fn stored_pages(&self) -> u64 {
        self.crcs.len() as u64
    }

    /// Add one page; extends the last run when contiguous.
    pub fn push(&mut self, vaddr: u64, crc: u32) {
        let file_page = self.crcs.len() as u64;
        self.crcs.push(crc);
        if let Some(last) = self.runs.last_mut() {
            if last.vaddr + last.npages * PAGE_SIZE == vaddr && last.file_page + last.npages == file_page {
                last.npages += 1;
                return;
            }
        }
        self.runs.push(PageRun { vaddr, npages: 1, file_page });
    }

    /// The run holding the page at `vaddr`, if it is stored.
    pub fn run_at(&self, vaddr: u64) -> Option<&PageRun> {
        let i = self.runs.partition_point(|r| r.vaddr <= vaddr);
        let r = self.runs.get(i.checked_sub(1)?)?;
        ((vaddr - r.vaddr) / PAGE_SIZE < r.npages).then_some(r)
    }

    /// File page holding the contents of the page at `vaddr`, if stored.
    pub fn lookup(&self, vaddr: u64) -> Option<u64> {
        self.run_at(vaddr).map(|r| r.file_page + (vaddr - r.vaddr) / PAGE_SIZE)
    }
}

/// Everything needed to rebuild one sandboxed process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessImage {
    pub created_unix_ms: u64,
    pub kernel: String,
    pub sandbox: SandboxRecord,
    pub threads: Vec<ThreadState>,
    pub mm: MmState,
    pub sigactions: Vec<SigAction>,
    pub rlimits: Vec<(u32, u64, u64)>,
    pub creds: Creds,
    pub cwd: String,
    pub umask: u32,
    pub personality: u32,
    /// Thread name (`/proc/PID/comm`).
    pub comm: String,
    pub files: Vec<FileRef>,
    pub vmas: Vec<Vma>,
    pub fds: Vec<FdRecord>,
    pub pages: PageIndex,
    /// Contents of the sandbox's private tmpfs mounts (`/tmp`, `/dev/shm`).
    pub tmp: Vec<crate::tmpfs::Entry>,
    /// Scheduling and prctl attributes of the process (its leader thread).
    pub attrs: ProcAttrs,
    /// Set when pages.img and the /tmp contents are encrypted (see `seal.rs`).
    pub seal: Option<crate::seal::SealInfo>,
    /// Set for a diff: the base image it was captured against and the pages it takes
    /// from it (see `layers.rs`).
    pub base: Option<BaseRef>,
    /// Its live child processes, each with its own (format 20).
    pub children: Vec<ChildImage>,
    /// Descriptors the leader holds only to hand them down to its children (open
    /// files only children held at capture, copied into the leader to be described
    /// like its own), closed once the children exist.
    pub handed_down: Vec<i32>,
}

/// A live process below the runtime (a child or grandchild started at init): its
/// place in the process tree, its descriptors as the leader's, and its own image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildImage {
    /// Its pid in the sandbox's namespace.
    pub pid: i32,
    /// Its process group and session (ids in the namespace).
    pub pgid: i32,
    pub sid: i32,
    /// What keys its pages in the leader's page index: its page at address `a` is
    /// stored as the index's `a | key` (user addresses lie below 2^47; see [`child_key`]).
    pub key: u64,
    /// Its descriptors: (number, the leader's descriptor it is a copy of, close-on-exec).
    pub fds: Vec<(i32, i32, bool)>,
    /// Address ranges (start, pages) whose contents are the leader's image's at the
    /// same addresses (memory a forked child has not written since): not stored again.
    pub from_leader: Vec<(u64, u64)>,
    /// Shared mappings it shares with the leader (shared anonymous memory, a shared
    /// memfd or deleted-file mapping, inherited across its fork): the leader's
    /// mapping at the same place, kept across the fork with its own protection and
    /// advice (its `kind` is the leader's).
    pub inherited: Vec<Vma>,
    /// Its threads, memory layout, attributes and children (its `fds`, `pages`, `tmp`
    /// and `sandbox` are the leader's, not repeated).
    pub image: Box<ProcessImage>,
}

/// Consecutive pages `pages` (addresses, sorted) as runs (start, pages).
pub fn page_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &a in pages {
        match runs.last_mut() {
            Some((s, n)) if *s + *n * PAGE_SIZE == a => *n += 1,
            _ => runs.push((a, 1)),
        }
    }
    runs
}

/// The key of the `n`th child process (in the tree's pre-order) in the page index.
pub fn child_key(n: usize) -> u64 {
    (n as u64 + 1) << 48
}

impl ProcessImage {
    /// The action the image has for signal `sig` ([`SigAction::words`]); zeros, the
    /// default action, when it has none.
    pub fn sigaction_words(&self, sig: u32) -> [u64; 4] {
        self.sigactions.iter().find(|a| a.sig == sig).map_or([0; 4], SigAction::words)
    }

    /// Each byte string the descriptors of the process and of its children carry of
    /// their data ([`FdKind::payloads_mut`]), in a fixed order: the process's
    /// descriptors in order, then each child's, depth first. A sealed image encrypts
    /// each (format 24), numbered in this order, so none is in clear in state.bin.
    pub fn fd_payloads_mut(&mut self, f: &mut dyn FnMut(&mut Vec<u8>)) {
        for r in &mut self.fds {
            r.kind.payloads_mut(f);
        }
        for c in &mut self.children {
            c.image.fd_payloads_mut(f);
        }
    }
}

impl FdKind {
    /// The process's data this descriptor carries, in order: a pipe's buffered bytes,
    /// each message queued on a socketpair end, a memfd's or deleted file's contents
    /// (also of an object made only for its mappings or in flight).
    pub fn payloads_mut(&mut self, f: &mut dyn FnMut(&mut Vec<u8>)) {
        match self {
            FdKind::Pipe { buffered, .. } => f(buffered),
            FdKind::SocketPair { queued, .. } => queued.iter_mut().for_each(&mut *f),
            FdKind::MemFd { content, .. } | FdKind::DeletedTmp { content, .. } => f(content),
            FdKind::MapOnly { object } | FdKind::InFlight { object, .. } => object.payloads_mut(f),
            FdKind::Null
            | FdKind::Log
            | FdKind::Control
            | FdKind::Path { .. }
            | FdKind::EventFd { .. }
            | FdKind::TimerFd { .. }
            | FdKind::Epoll { .. }
            | FdKind::SignalFd { .. }
            | FdKind::Dup { .. }
            | FdKind::PidFdSelf { .. }
            | FdKind::PathLocked { .. }
            | FdKind::Inotify { .. } => {}
        }
    }
}

/// The base a diff image was captured against. A page of the diff comes from, in this
/// order: its own `pages` index; the base's page at the same address, if the address
/// lies in `runs`; a zero page (or, in a private file mapping, the file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRef {
    /// The base's content id (sha256 of its state.bin and pages.img, hex).
    pub id: String,
    /// Where the base was when the diff was captured (`BASES/<id>`).
    pub dir: PathBuf,
    /// CRC of the base's state.bin (its `Snapshot::id`): checked before any page is
    /// taken from it; each base page is then checked against the base's own CRC.
    pub state_crc: u32,
    /// Address ranges (start, pages) whose contents are the base's, sorted, disjoint.
    pub runs: Vec<(u64, u64)>,
    /// The same pages as pieces of the base's pages.img (address, pages, the base's
    /// file page of the first), in address order, and the base's CRC of each of their
    /// pages in that order (format 22): a restore builds its page index from these and
    /// the base's pages.img alone, and reads the base's state.bin (to check `state_crc`)
    /// beside the restore instead of before it.
    pub pieces: Vec<PageRun>,
    pub crcs: Vec<u32>,
    /// Pages the base's pages.img holds (its size is checked against it at open).
    pub stored_pages: u64,
}

impl BaseRef {
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }
}

/// Process attributes set again at restore (read from the leader thread at capture).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcAttrs {
    /// Nice value (-20..19).
    pub nice: i32,
    /// CPU affinity mask as the kernel reports it (sched_getaffinity bytes).
    pub affinity: Vec<u8>,
    /// PR_GET_TIMERSLACK, ns.
    pub timer_slack_ns: u64,
    pub thp_disable: bool,
    pub child_subreaper: bool,
    /// PR_GET_DUMPABLE.
    pub dumpable: u32,
    /// /proc/PID/oom_score_adj.
    pub oom_score_adj: i32,
    /// The process leads its own session (setsid) / process group (setpgid(0, 0)).
    pub session_leader: bool,
    pub group_leader: bool,
    /// Its process group and session as ids in the sandbox (format 20; what a child
    /// process joins again).
    pub pgid: i32,
    pub sid: i32,
    /// The signal it gets when its parent dies (PR_SET_PDEATHSIG; format 21). Set
    /// again for a child process; the runtime gets SIGKILL (it dies with the node).
    pub pdeathsig: i32,
    /// Interval timers (ITIMER_REAL, VIRTUAL, PROF) as `struct itimerval` words:
    /// interval s, interval µs, value (left) s, value µs. A timer is re-armed with what
    /// was left at capture (time stands still while the snapshot is on disk).
    pub itimers: [[i64; 4]; 3],
    /// POSIX timers (timer_create), recreated with their ids.
    pub posix_timers: Vec<PosixTimer>,
    /// Signals queued for the process (kill, sigqueue) and not delivered at capture,
    /// in queue order (a thread's own are in its [`ThreadState::pending`]).
    pub pending_signals: Vec<PendingSignal>,
    /// Children that had exited and were not waited for (zombies), recreated with
    /// their pids and exit statuses.
    pub zombies: Vec<Zombie>,
}

/// A zombie child of the process: its pid in the sandbox and the status a wait for
/// it returns (an exit code: `code << 8`; one killed by a signal is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zombie {
    pub pid: i32,
    pub status: i32,
}

/// A POSIX timer: recreated with the same id (PR_TIMER_CREATE_RESTORE_IDS), clock,
/// notification and value, and re-armed with what was left of its period (relative,
/// like the interval timers). Overruns are not carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixTimer {
    pub id: i32,
    pub clockid: i32,
    pub signo: i32,
    pub sigval: u64,
    /// SIGEV_SIGNAL / SIGEV_NONE, with SIGEV_THREAD_ID for a thread target.
    pub notify: i32,
    /// The target thread's id in the instance's pid namespace (SIGEV_THREAD_ID).
    pub tid: i32,
    /// Left of the current period, and the interval, as (seconds, nanoseconds).
    pub value: (i64, i64),
    pub interval: (i64, i64),
}

/// Encode `img` into the framed state format.
pub fn encode_state(img: &ProcessImage) -> Vec<u8> {
    let payload = bincode::serialize(img).expect("ProcessImage is always serializable");
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Decode and verify a framed state.
pub fn decode_state(dir: &Path, bytes: &[u8]) -> Result<ProcessImage, ImageError> {
    let corrupt = |detail: String| ImageError::Corrupt { dir: dir.to_path_buf(), file: STATE_FILE, detail };
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(ImageError::BadMagic { dir: dir.to_path_buf(), file: STATE_FILE });
    }
    if bytes.len() < HEADER_LEN + 4 {
        return Err(corrupt(format!("{} bytes, shorter than the header", bytes.len())));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(ImageError::Version { dir: dir.to_path_buf(), found: version });
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    if len > MAX_STATE_LEN {
        return Err(corrupt(format!("payload length {len} exceeds the {MAX_STATE_LEN} byte cap")));
    }
    let end = HEADER_LEN + len as usize;
    if bytes.len() != end + 4 {
        return Err(corrupt(format!("expected {} bytes, found {}", end + 4, bytes.len())));
    }
    let want = u32::from_le_bytes(bytes[end..end + 4].try_into().expect("4 bytes"));
    let got = crc32fast::hash(&bytes[..end]);
    if want != got {
        return Err(corrupt(format!("checksum mismatch: stored {want:#010x}, computed {got:#010x}")));
    }
    bincode::deserialize(&bytes[HEADER_LEN..end]).map_err(|e| corrupt(format!("decoding: {e}")))
}

/// A snapshot directory opened for restore: the decoded state plus the page file.
pub struct Snapshot {
    pub dir: PathBuf,
    pub image: ProcessImage,
    pub pages: File,
    /// Identity of this image (the CRC of its state), which working sets refer to.
    pub id: u32,
    /// The ciphers of a sealed image (`image.tmp` is already decrypted).
    pub sealer: Option<std::sync::Arc<crate::seal::Sealer>>,
}

impl Snapshot {
    /// Open with this process's node key (see `seal::install`).
    pub fn open(dir: &Path) -> Result<Snapshot, ImageError> {
        Snapshot::open_with(dir, crate::seal::node_key().as_deref())
    }

    /// Open with `key` (needed only if the image is sealed).
    pub fn open_with(dir: &Path, key: Option<&crate::seal::NodeKey>) -> Result<Snapshot, ImageError> {
        let io = |file: &'static str| move |source| ImageError::Io { dir: dir.to_path_buf(), file, source };
        let mut bytes = Vec::new();
        File::open(dir.join(STATE_FILE)).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io(STATE_FILE))?;
        let mut image = decode_state(dir, &bytes)?;
        let id = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
        let sealer = match &image.seal {
            None => None,
            Some(info) => {
                let s = crate::seal::Sealer::open(info, key).map_err(|source| ImageError::Sealed { dir: dir.to_path_buf(), source })?;
                if image.pages.tags.len() != image.pages.crcs.len() {
                    return Err(ImageError::Corrupt {
                        dir: dir.to_path_buf(),
                        file: STATE_FILE,
                        detail: format!("{} page tags for {} pages", image.pages.tags.len(), image.pages.crcs.len()),
                    });
                }
                for (n, e) in image.tmp.iter_mut().enumerate() {
                    if let crate::tmpfs::EntryKind::File { data } = &mut e.kind {
                        if !s.open_data(n as u64, data) {
                            return Err(ImageError::Forged { dir: dir.to_path_buf(), what: format!("the captured {}", e.path) });
                        }
                    }
                }
                let mut n = 0;
                let mut forged = false;
                image.fd_payloads_mut(&mut |data| {
                    forged |= !s.open_fd_data(n, data);
                    n += 1;
                });
                if forged {
                    return Err(ImageError::Forged { dir: dir.to_path_buf(), what: "the descriptors' captured contents".into() });
                }
                Some(std::sync::Arc::new(s))
            }
        };
        let pages = File::open(dir.join(PAGES_FILE)).map_err(io(PAGES_FILE))?;
        let size = pages.metadata().map_err(io(PAGES_FILE))?.len();
        let want = image.pages.stored_pages() * PAGE_SIZE;
        if size != want {
            return Err(ImageError::Corrupt {
                dir: dir.to_path_buf(),
                file: PAGES_FILE,
                detail: format!("size is {size} bytes, the index needs {want}"),
            });
        }
        Ok(Snapshot { dir: dir.to_path_buf(), image, pages, id, sealer })
    }
}

/// Writes a snapshot into `<dir>.partial` and renames it into place, so a crash
/// never leaves a half-written snapshot under the final name.
pub struct SnapshotWriter {
    final_dir: PathBuf,
    tmp_dir: PathBuf,
    pages: io::BufWriter<File>,
    /// Set when this process holds a node key: the image is sealed with it.
    sealer: Option<crate::seal::Sealer>,
    buf: Vec<u8>,
}

impl SnapshotWriter {
    /// Create a writer that seals the image when this process holds a node key.
    pub fn create(dir: &Path) -> Result<SnapshotWriter, ImageError> {
        let sealer = match crate::seal::node_key() {
            Some(key) => Some(crate::seal::Sealer::new(&key).map_err(|source| ImageError::Seal { dir: dir.to_path_buf(), source })?),
            None => None,
        };
        SnapshotWriter::create_with(dir, sealer)
    }

    /// Create a writer that seals with `sealer` (or not).
    pub fn create_with(dir: &Path, sealer: Option<crate::seal::Sealer>) -> Result<SnapshotWriter, ImageError> {
        if dir.exists() {
            return Err(ImageError::Exists { dir: dir.to_path_buf() });
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "snapshot".into());
        let tmp_dir = dir.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let werr = |file: &str| {
            let file = file.to_string();
            let d = dir.to_path_buf();
            move |source| ImageError::Write { dir: d, file, source }
        };
        let _ = std::fs::remove_dir_all(&tmp_dir);
        std::fs::create_dir_all(&tmp_dir).map_err(werr("."))?;
        let pages = File::create(tmp_dir.join(PAGES_FILE)).map_err(werr(PAGES_FILE))?;
        Ok(SnapshotWriter {
            final_dir: dir.to_path_buf(),
            tmp_dir,
            pages: io::BufWriter::with_capacity(4 << 20, pages),
            sealer,
            buf: Vec::new(),
        })
    }

    fn werr(&self, file: &str) -> impl FnOnce(io::Error) -> ImageError {
        let file = file.to_string();
        let dir = self.final_dir.clone();
        move |source| ImageError::Write { dir, file, source }
    }

    /// Whether this writer seals the image.
    pub fn seals(&self) -> bool {
        self.sealer.is_some()
    }

    /// Append the contents of the page at `vaddr` to pages.img (sealed when the
    /// writer seals) and record it in `index`.
    pub fn store_page(&mut self, index: &mut PageIndex, vaddr: u64, page: &[u8]) -> Result<(), ImageError> {
        debug_assert_eq!(page.len() as u64, PAGE_SIZE);
        let stored = match &self.sealer {
            None => page,
            Some(s) => {
                self.buf.clear();
                self.buf.extend_from_slice(page);
                index.tags.push(s.seal_page(index.stored_pages(), &mut self.buf));
                &self.buf[..]
            }
        };
        index.push(vaddr, crc32fast::hash(stored));
        self.pages.write_all(stored).map_err(self.werr(PAGES_FILE))
    }

    /// Write the state, fsync everything and move the directory into place.
    pub fn finish(self, img: &ProcessImage) -> Result<PathBuf, ImageError> {
        let pages = self.pages.into_inner().map_err(|e| e.into_error()).map_err({
            let dir = self.final_dir.clone();
            move |source| ImageError::Write { dir, file: PAGES_FILE.into(), source }
        })?;
        let werr = |file: &str| {
            let file = file.to_string();
            let dir = self.final_dir.clone();
            move |source| ImageError::Write { dir, file, source }
        };
        pages.sync_all().map_err(werr(PAGES_FILE))?;
        let state = match &self.sealer {
            None => encode_state(img),
            Some(s) => {
                let mut img = img.clone();
                img.seal = Some(s.info().clone());
                for (n, e) in img.tmp.iter_mut().enumerate() {
                    if let crate::tmpfs::EntryKind::File { data } = &mut e.kind {
                        s.seal_data(n as u64, data);
                    }
                }
                let mut n = 0;
                img.fd_payloads_mut(&mut |data| {
                    s.seal_fd_data(n, data);
                    n += 1;
                });
                encode_state(&img)
            }
        };
        let mut st = File::create(self.tmp_dir.join(STATE_FILE)).map_err(werr(STATE_FILE))?;
        st.write_all(&state).map_err(werr(STATE_FILE))?;
        st.sync_all().map_err(werr(STATE_FILE))?;
        if self.final_dir.exists() {
            let _ = std::fs::remove_dir_all(&self.tmp_dir);
            return Err(ImageError::Exists { dir: self.final_dir.clone() });
        }
        std::fs::rename(&self.tmp_dir, &self.final_dir).map_err(werr("."))?;
        Ok(self.final_dir.clone())
    }

    /// Remove the partial directory (capture failed).
    pub fn abandon(self) {
        let _ = std::fs::remove_dir_all(&self.tmp_dir);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> ProcessImage {
        let mut pages = PageIndex::default();
        pages.push(0x1000, 1);
        pages.push(0x2000, 2);
        pages.push(0x5000, 3);
        ProcessImage {
            created_unix_ms: 1,
            kernel: "6.18".into(),
            sandbox: SandboxRecord {
                runtime: "python3".into(),
                handler: "h.handler".into(),
                code_dir: "/code".into(),
                runtime_dir: None,
                opt_dir: None,
                memory_mb: 128,
                cpu_millis: 1000,
                pids_max: 64,
                tmp_size_mb: 16,
                uid: 65534,
                gid: 65534,
                restore_notice: true,
                code_fingerprint: "ab".into(),
            },
            threads: vec![ThreadState {
                tid: 1,
                regs: [7; 27],
                xstate: vec![1, 2, 3],
                sigmask: 0,
                rseq: Some(Rseq { ptr: 0x10, len: 32, sig: 0x53053053 }),
                robust_list: (0x20, 24),
                tid_address: 0x30,
                altstack: None,
                comm: "python3".into(),
                pending: vec![PendingSignal { signo: 10, info: vec![10; 128] }],
                sched_policy: libc::SCHED_BATCH,
            }],
            mm: MmState { fields: MmFields::default(), brk: 0x4000, auxv: vec![0; 16], exe: "/usr/bin/python3.11".into() },
            sigactions: vec![],
            rlimits: vec![(7, 1024, 4096)],
            creds: Creds { uid: [65534; 3], gid: [65534; 3], groups: vec![] },
            cwd: "/var/task".into(),
            umask: 0o22,
            personality: 0,
            comm: "python3".into(),
            files: vec![],
            vmas: vec![Vma { start: 0x1000, end: 0x6000, prot: 3, kind: VmaKind::Anon { growsdown: false }, advice: vec![] }],
            fds: vec![
                FdRecord { fd: 3, kind: FdKind::Control },
                FdRecord { fd: 5, kind: FdKind::Epoll { flags: 0o2000000, items: vec![(6, 0x19, 0xd)] } },
                FdRecord { fd: 6, kind: FdKind::EventFd { count: 2, semaphore: false, flags: 0o4000 } },
            ],
            pages,
            tmp: vec![crate::tmpfs::Entry {
                path: "/tmp/x".into(),
                kind: crate::tmpfs::EntryKind::File { data: b"TMP-SECRET-DATA".to_vec() },
                mode: 0o600,
                uid: 65534,
                gid: 65534,
                mtime: (1, 2),
            }],
            seal: None,
            base: None,
            attrs: ProcAttrs {
                nice: 5,
                affinity: vec![1, 0, 0, 0, 0, 0, 0, 0],
                session_leader: true,
                itimers: [[0, 0, 3600, 5], [0; 4], [60, 0, 60, 0]],
                posix_timers: vec![PosixTimer { id: 3, clockid: 1, signo: 10, sigval: 7, notify: 4, tid: 2, value: (5, 0), interval: (0, 0) }],
                ..Default::default()
            },
            children: vec![],
            handed_down: vec![],
        }
    }

    #[test]
    fn state_round_trips() {
        let mut img = sample();
        let mut child = sample();
        child.threads[0].tid = 3;
        img.children.push(ChildImage { pid: 3, pgid: 3, sid: 2, key: child_key(0), fds: vec![(1, 1, false), (7, 205, true)], from_leader: vec![(0x1000, 2)], inherited: vec![], image: Box::new(child) });
        img.handed_down = vec![205];
        let bytes = encode_state(&img);
        assert_eq!(decode_state(Path::new("/s"), &bytes).unwrap(), img);
    }

    #[test]
    fn page_tags_are_one_byte_string_and_a_ragged_one_is_refused() {
        let mut img = sample();
        img.pages.tags = (0..img.pages.crcs.len() as u8).map(|i| [i; crate::seal::TAG_LEN]).collect();
        let bytes = encode_state(&img);
        assert_eq!(decode_state(Path::new("/s"), &bytes).unwrap(), img);
        // The tags end the index: a u64 length of 16 bytes a tag, then the bytes.
        let index = bincode::serialize(&img.pages).unwrap();
        let n = img.pages.tags.len() * crate::seal::TAG_LEN;
        assert_eq!(&index[index.len() - n - 8..index.len() - n], &(n as u64).to_le_bytes());
        assert_eq!(&index[index.len() - n..], img.pages.tags.as_flattened());
        // One byte short of whole tags.
        let mut ragged = index[..index.len() - n - 8].to_vec();
        ragged.extend_from_slice(&(n as u64 - 1).to_le_bytes());
        ragged.extend_from_slice(&img.pages.tags.as_flattened()[..n - 1]);
        let e = bincode::deserialize::<PageIndex>(&ragged).unwrap_err().to_string();
        assert!(e.contains("page tags of 16 bytes each"), "{e}");
    }

    #[test]
    fn corruption_is_detected() {
        let bytes = encode_state(&sample());
        let mut flipped = bytes.clone();
        flipped[30] ^= 0x40;
        let e = decode_state(Path::new("/s"), &flipped).unwrap_err().to_string();
        assert!(e.starts_with("snapshot /s: state.bin is truncated or corrupt (checksum mismatch"), "{e}");
        let e = decode_state(Path::new("/s"), &bytes[..bytes.len() - 9]).unwrap_err().to_string();
        assert!(e.contains("is truncated or corrupt (expected"), "{e}");
        let e = decode_state(Path::new("/s"), b"NOTANIMAGEATALL_______").unwrap_err().to_string();
        assert_eq!(e, "snapshot /s: state.bin is not a Thaw image (bad magic)");
        let mut v2 = bytes.clone();
        v2[8] = 99;
        let e = decode_state(Path::new("/s"), &v2).unwrap_err().to_string();
        assert_eq!(e, format!("snapshot /s: format version 99 is not supported (this build reads version {FORMAT_VERSION})"));
    }

    #[test]
    fn page_index_merges_and_finds() {
        let img = sample();
        assert_eq!(img.pages.runs.len(), 2);
        assert_eq!(img.pages.lookup(0x1000), Some(0));
        assert_eq!(img.pages.lookup(0x2000), Some(1));
        assert_eq!(img.pages.lookup(0x3000), None);
        assert_eq!(img.pages.lookup(0x5000), Some(2));
        assert_eq!(img.pages.lookup(0x0), None);
        assert_eq!(img.pages.lookup(0x6000), None);
    }

    #[test]
    fn writer_is_atomic_and_refuses_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("snap");
        let mut w = SnapshotWriter::create(&dir).unwrap();
        let mut idx = PageIndex::default();
        for a in [0x1000, 0x2000, 0x5000] {
            w.store_page(&mut idx, a, &[1u8; 4096]).unwrap();
        }
        assert!(idx.tags.is_empty(), "no node key: not sealed");
        assert!(!dir.exists());
        w.finish(&sample()).unwrap();
        let s = Snapshot::open(&dir).unwrap();
        assert_eq!(s.image, sample());
        assert!(matches!(SnapshotWriter::create(&dir), Err(ImageError::Exists { .. })));
        // Truncating pages.img is caught at open.
        let f = std::fs::OpenOptions::new().write(true).open(dir.join(PAGES_FILE)).unwrap();
        f.set_len(4096).unwrap();
        let e = Snapshot::open(&dir).err().unwrap().to_string();
        assert!(e.ends_with("pages.img is truncated or corrupt (size is 4096 bytes, the index needs 12288)"), "{e}");
    }

    #[test]
    fn a_sealed_image_opens_only_with_its_key_and_hides_pages_and_tmp() {
        use crate::seal::{NodeKey, Sealer};
        let key = NodeKey::generate().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("snap");
        let mut w = SnapshotWriter::create_with(&dir, Some(Sealer::new(&key).unwrap())).unwrap();
        let mut img = sample();
        img.pages = PageIndex::default();
        let secret = |i: u8| -> Vec<u8> { (0..4096).map(|k| if k < 12 { b"SECRET-VALUE"[k] } else { i }).collect() };
        for (i, a) in [0x1000u64, 0x2000, 0x5000].into_iter().enumerate() {
            w.store_page(&mut img.pages, a, &secret(i as u8)).unwrap();
        }
        assert_eq!(img.pages.tags.len(), 3);
        w.finish(&img).unwrap();
        for f in [PAGES_FILE, STATE_FILE] {
            let raw = std::fs::read(dir.join(f)).unwrap();
            assert!(!raw.windows(12).any(|w| w == b"SECRET-VALUE"), "{f} holds the page in clear");
            assert!(!raw.windows(10).any(|w| w == b"TMP-SECRET"), "{f} holds /tmp in clear");
        }
        // No key, or another key: refused, naming the key the image needs.
        let chain = |e: ImageError| format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default());
        let e = chain(Snapshot::open_with(&dir, None).err().unwrap());
        assert!(e.contains(&format!("encrypted with node key {}", key.id())) && e.contains("no node key"), "{e}");
        let other = NodeKey::generate().unwrap();
        let e = chain(Snapshot::open_with(&dir, Some(&other)).err().unwrap());
        assert!(e.contains(&format!("not with this process's node key {}", other.id())), "{e}");
        // With the key: /tmp in clear again, every page decrypts at its index only.
        let s = Snapshot::open_with(&dir, Some(&key)).unwrap();
        assert_eq!(s.image.tmp, sample().tmp);
        let sealer = s.sealer.as_ref().unwrap();
        for fp in 0..3u64 {
            let mut page = vec![0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&s.pages, &mut page, fp * 4096).unwrap();
            assert_eq!(crc32fast::hash(&page), s.image.pages.crcs[fp as usize], "CRCs cover the stored bytes");
            assert!(sealer.open_page(fp, &mut page, &s.image.pages.tags[fp as usize]));
            assert_eq!(page, secret(fp as u8));
        }
    }

    #[test]
    fn a_sealed_image_hides_what_its_descriptors_carry_and_refuses_a_changed_payload() {
        use crate::seal::{NodeKey, Sealer};
        let key = NodeKey::generate().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("snap");
        let w = SnapshotWriter::create_with(&dir, Some(Sealer::new(&key).unwrap())).unwrap();
        let mut img = sample();
        img.pages = PageIndex::default();
        let memfd = |tag: &str| FdKind::MemFd { name: "m".into(), content: format!("FD-SECRET-{tag}").into_bytes(), seals: 0, flags: 2, pos: 0 };
        img.fds.extend([
            FdRecord { fd: 10, kind: FdKind::Pipe { pipe: 1, write: false, flags: 0, buffered: b"FD-SECRET-pipe".to_vec(), size: 65536 } },
            FdRecord { fd: 11, kind: FdKind::Pipe { pipe: 1, write: true, flags: 1, buffered: vec![], size: 65536 } },
            FdRecord {
                fd: 12,
                kind: FdKind::SocketPair { pair: 2, first: true, sock_type: 1, flags: 2, shutdown: 0, queued: vec![b"FD-SECRET-one".to_vec(), b"FD-SECRET-two".to_vec()], options: vec![] },
            },
            FdRecord { fd: 13, kind: memfd("held") },
            FdRecord { fd: 14, kind: FdKind::DeletedTmp { path: "/tmp/x".into(), content: b"FD-SECRET-deleted".to_vec(), mode: 0o600, flags: 2, pos: 3 } },
            FdRecord { fd: 15, kind: FdKind::MapOnly { object: Box::new(memfd("mapped")) } },
            FdRecord { fd: 16, kind: FdKind::InFlight { sends: vec![(12, 0, 0)], object: Box::new(memfd("in-flight")) } },
        ]);
        let mut child = sample();
        child.fds = vec![FdRecord { fd: 3, kind: memfd("child") }];
        img.children.push(ChildImage { pid: 3, pgid: 3, sid: 2, key: child_key(0), fds: vec![], from_leader: vec![], inherited: vec![], image: Box::new(child) });
        let mut clear = 0;
        img.fd_payloads_mut(&mut |d| clear += usize::from(d.starts_with(b"FD-SECRET")));
        assert_eq!(clear, 8, "every payload is visited");
        w.finish(&img).unwrap();
        let raw = std::fs::read(dir.join(STATE_FILE)).unwrap();
        assert!(!raw.windows(9).any(|w| w == b"FD-SECRET"), "state.bin holds a descriptor's payload in clear");
        let mut opened = Snapshot::open_with(&dir, Some(&key)).unwrap().image;
        assert!(opened.seal.take().is_some());
        assert_eq!(opened, img, "opened, every payload is back in clear");
        // One payload changed (its CRC made right): refused as forged, never used.
        let mut stored = decode_state(&dir, &raw).unwrap();
        let mut n = 0;
        stored.fd_payloads_mut(&mut |d| {
            if n == 3 {
                d[0] ^= 1;
            }
            n += 1;
        });
        std::fs::write(dir.join(STATE_FILE), encode_state(&stored)).unwrap();
        let e = Snapshot::open_with(&dir, Some(&key)).err().unwrap();
        assert!(matches!(e, ImageError::Forged { .. }), "{e}");
        assert!(e.to_string().contains("descriptors' captured contents"), "{e}");
    }
}
