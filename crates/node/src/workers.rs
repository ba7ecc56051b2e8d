//! A fixed pool of long-lived OS threads for the engine calls that tie a
//! sandbox to the calling thread (boot, restore, capture, kill).
//!
//! `Instance::boot`/`restore` make the calling thread the sandbox's parent
//! (PR_SET_PDEATHSIG fires when *that thread* exits) and, during restore, its
//! ptrace tracer. Tokio's blocking pool retires idle threads, which would kill
//! sandboxes, so these calls run here instead: threads that live as long as the node.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use thiserror::Error;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("the {pool} worker pool is shut down")]
    Closed { pool: &'static str },
    #[error("a {pool} worker panicked while running a job")]
    Panicked { pool: &'static str },
    #[error("starting {pool} worker thread")]
    Spawn { pool: &'static str, #[source] source: std::io::Error },
}

pub struct WorkerPool {
    name: &'static str,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl WorkerPool {
    pub fn new(name: &'static str, size: usize) -> Result<WorkerPool, WorkerError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..size.max(1) {
            let rx = rx.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(guard) => guard.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .map_err(|source| WorkerError::Spawn { pool: name, source })?;
            threads.push(t);
        }
        Ok(WorkerPool { name, tx: Mutex::new(Some(tx)), threads: Mutex::new(threads) })
    }

    /// Queue `f` without waiting for it.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) -> Result<(), WorkerError> {
        let guard = self.tx.lock().map_err(|_| WorkerError::Closed { pool: self.name })?;
        let tx = guard.as_ref().ok_or(WorkerError::Closed { pool: self.name })?;
        tx.send(Box::new(f)).map_err(|_| WorkerError::Closed { pool: self.name })
    }

    /// Run `f` on a worker and wait for its result.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, WorkerError> {
        let (tx, rx) = oneshot::channel();
        self.spawn(move || {
            let _ = tx.send(f());
        })?;
        rx.await.map_err(|_| WorkerError::Panicked { pool: self.name })
    }

    /// Finish the queued jobs, then stop and join the threads.
    pub fn shutdown(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let threads = self.threads.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_named_long_lived_threads() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let pool = WorkerPool::new("test", 2).unwrap();
        let name = rt.block_on(pool.run(|| std::thread::current().name().unwrap().to_string())).unwrap();
        assert!(name.starts_with("test-"));
        pool.shutdown();
        assert!(matches!(pool.spawn(|| ()), Err(WorkerError::Closed { .. })));
    }
}
