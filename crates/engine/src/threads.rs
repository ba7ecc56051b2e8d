//! Stopping every thread of a live process, and naming them as its image does: what
//! capture, an in-place reset, repurposing and the differential check all begin with.

use std::io;

use thiserror::Error;

use crate::image::ThreadState;
use crate::procfs::{self, Status};
use crate::sys::ptrace::Tracee;

/// A thread that could not be stopped (or the threads could not be listed: `tid` is
/// the process's then).
#[derive(Debug, Error)]
#[error("{what} {tid}")]
pub struct SeizeError {
    pub tid: i32,
    pub what: &'static str,
    #[source]
    pub source: io::Error,
}

impl SeizeError {
    /// What failed, as words, and the error: for a module's own `Io { what, source }`.
    pub fn parts(self) -> (String, io::Error) {
        (format!("{} {}", self.what, self.tid), self.source)
    }
}

/// Stop every thread of `pid` (PTRACE_SEIZE + INTERRUPT), listing them again until a
/// listing finds none that is not stopped yet: a thread may start while the others are
/// being stopped. The stopped ones are in `traced`, the leader first, then by tid —
/// also on error, for the caller to let go or kill.
pub fn seize_all(pid: i32, traced: &mut Vec<Tracee>) -> Result<(), SeizeError> {
    loop {
        let tids = procfs::tids(pid).map_err(|source| SeizeError { tid: pid, what: "listing the threads of", source })?;
        let new: Vec<i32> = tids.iter().copied().filter(|t| !traced.iter().any(|x| x.pid.as_raw() == *t)).collect();
        if new.is_empty() {
            traced.sort_by_key(|t| (t.pid.as_raw() != pid, t.pid.as_raw()));
            return Ok(());
        }
        for tid in new {
            let t = Tracee::seize_and_stop(tid)
                .map_err(|source| SeizeError { tid, what: "seizing thread (is another tracer attached?)", source })?;
            traced.push(t);
        }
    }
}

/// Pair each of `traced` (threads of `pid`) with the thread of `image` that has its
/// tid inside the sandbox's pid namespace (what the image records), with its /proc
/// status. Returns the pairs, in `traced`'s order, and the threads the image does not
/// have (started since the snapshot).
#[allow(clippy::type_complexity)]
pub fn name_by_image<'a>(pid: i32, traced: &[Tracee], image: &'a [ThreadState]) -> io::Result<(Vec<(Tracee, &'a ThreadState, Status)>, Vec<Tracee>)> {
    let mut named = Vec::with_capacity(traced.len());
    let mut extra = Vec::new();
    for tr in traced {
        let tid = tr.pid.as_raw();
        let status = procfs::thread_status(pid, tid)?;
        let ns_tid = *status.nspid.last().unwrap_or(&tid);
        match image.iter().find(|x| x.tid == ns_tid) {
            Some(image) => named.push((*tr, image, status)),
            None => extra.push(*tr),
        }
    }
    Ok((named, extra))
}
