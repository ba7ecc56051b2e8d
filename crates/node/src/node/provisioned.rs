//! Provisioned concurrency (issue #16): N instances of a published version kept
//! restored and idle, ready before the first call. The reaper tick tops them up
//! (`Node::provision`) — restores run on the instance workers, each admitted against
//! the node's instance and memory limits like any cold start — and the keep-alive
//! and the eviction for room never take them. Status: IN_PROGRESS until N are idle or
//! serving, then READY; FAILED (with the reason) when a restore is refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::invoke::start_instance;
use super::{error_chain, timestamp, FnState, Function, Idle, Node, NodeError};
use crate::node::VersionError;

/// Provisioned concurrency of one version.
#[derive(Debug, Clone)]
pub(super) struct Provisioned {
    pub(super) requested: usize,
    pub(super) last_modified: String,
    /// Restores under way (not yet idle).
    pub(super) starting: usize,
    pub(super) failure: Option<String>,
}

/// What Get/ListProvisionedConcurrencyConfig(s) report.
#[derive(Debug, Clone)]
pub struct ProvisionedView {
    pub version: u64,
    pub requested: usize,
    pub allocated: usize,
    pub status: &'static str,
    pub reason: Option<String>,
    pub last_modified: String,
}

/// Idle instances of `rev` that provisioned concurrency holds (marked `true`), in
/// `st.idle` order: the first `requested` of them.
pub(super) fn protected(st: &FnState) -> Vec<bool> {
    let mut left: BTreeMap<u64, usize> = st.provisioned.iter().map(|(v, p)| (*v, p.requested)).collect();
    st.idle
        .iter()
        .map(|i| {
            let v = st.versions.iter().find(|(_, p)| Arc::ptr_eq(&p.rev, &i.rev)).map(|(v, _)| *v);
            match v.and_then(|v| left.get_mut(&v)) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        })
        .collect()
}

fn view(st: &FnState, version: u64, p: &Provisioned) -> ProvisionedView {
    let allocated = st
        .versions
        .get(&version)
        .map(|pv| st.idle.iter().filter(|i| Arc::ptr_eq(&i.rev, &pv.rev)).count())
        .unwrap_or(0)
        .min(p.requested);
    let status = if p.failure.is_some() && allocated < p.requested {
        "FAILED"
    } else if allocated >= p.requested {
        "READY"
    } else {
        "IN_PROGRESS"
    };
    ProvisionedView { version, requested: p.requested, allocated, status, reason: p.failure.clone(), last_modified: p.last_modified.clone() }
}

impl Node {
    pub(super) fn load_provisioned(&self, name: &str) -> Result<BTreeMap<u64, Provisioned>, NodeError> {
        Ok(self
            .registry
            .list_provisioned(name)?
            .into_iter()
            .map(|(v, requested, last_modified)| (v, Provisioned { requested, last_modified, starting: 0, failure: None }))
            .collect())
    }

    /// PutProvisionedConcurrencyConfig for a published version.
    pub fn put_provisioned(self: &Arc<Self>, name: &str, version: u64, n: usize) -> Result<ProvisionedView, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let v = {
            let mut st = f.lock();
            if !st.versions.contains_key(&version) {
                return Err(VersionError::NotFound(format!("{}:{version}", self.arn(name))));
            }
            let others: usize = st.provisioned.iter().filter(|(v, _)| **v != version).map(|(_, p)| p.requested).sum();
            let cap = st.settings.reserved_concurrency.map(|r| r as usize).unwrap_or(self.cfg.max_per_function).min(self.cfg.max_per_function);
            if n == 0 || others + n > cap {
                return Err(VersionError::Invalid(format!(
                    "ProvisionedConcurrentExecutions must be between 1 and {} for this function (its reserved concurrency or the node's --max-instances-per-function, minus what other versions provision)",
                    cap.saturating_sub(others)
                )));
            }
            let at = timestamp();
            self.registry.put_provisioned(name, version, Some((n, &at)))?;
            let p = st.provisioned.entry(version).or_insert(Provisioned { requested: n, last_modified: at.clone(), starting: 0, failure: None });
            p.requested = n;
            p.last_modified = at;
            p.failure = None;
            let p = p.clone();
            view(&st, version, &p)
        };
        self.provision();
        Ok(v)
    }

    pub fn provisioned(&self, name: &str, version: u64) -> Result<ProvisionedView, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let st = f.lock();
        let p = st.provisioned.get(&version).ok_or_else(|| {
            VersionError::NotFound(format!("No Provisioned Concurrency Config found for this function: {}:{version}", self.arn(name)))
        })?;
        Ok(view(&st, version, p))
    }

    pub fn provisioned_all(&self, name: &str) -> Result<Vec<ProvisionedView>, VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let st = f.lock();
        Ok(st.provisioned.iter().map(|(v, p)| view(&st, *v, p)).collect())
    }

    /// DeleteProvisionedConcurrencyConfig: its instances become ordinary idle ones
    /// (the keep-alive takes them).
    pub fn delete_provisioned(&self, name: &str, version: u64) -> Result<(), VersionError> {
        let f = self.function(name).ok_or_else(|| VersionError::NotFound(self.arn(name)))?;
        let mut st = f.lock();
        if st.provisioned.remove(&version).is_some() {
            self.registry.put_provisioned(name, version, None)?;
        }
        Ok(())
    }

    /// Start the restores that bring every provisioned version up to its count.
    pub fn provision(self: &Arc<Self>) {
        if self.shutting_down.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        for f in fs {
            let jobs: Vec<(u64, usize)> = {
                let mut st = f.lock();
                if st.deleted {
                    continue;
                }
                let have: BTreeMap<u64, usize> = st
                    .provisioned
                    .keys()
                    .map(|v| (*v, st.versions.get(v).map(|pv| st.idle.iter().filter(|i| Arc::ptr_eq(&i.rev, &pv.rev)).count()).unwrap_or(0)))
                    .collect();
                let mut jobs = vec![];
                for (v, p) in st.provisioned.iter_mut() {
                    let missing = p.requested.saturating_sub(have[v] + p.starting);
                    if missing > 0 && p.failure.is_none() {
                        p.starting += missing;
                        jobs.push((*v, missing));
                    }
                }
                jobs
            };
            for (v, n) in jobs {
                for _ in 0..n {
                    let (node, f) = (self.clone(), f.clone());
                    tokio::spawn(async move { node.provision_one(&f, v).await });
                }
            }
        }
    }

    async fn provision_one(self: Arc<Self>, f: &Arc<Function>, version: u64) {
        let done = |st: &mut FnState, failure: Option<String>| {
            if let Some(p) = st.provisioned.get_mut(&version) {
                p.starting = p.starting.saturating_sub(1);
                if failure.is_some() {
                    p.failure = failure;
                }
            }
        };
        let rev = {
            let mut st = f.lock();
            let Some(rev) = st.versions.get(&version).map(|p| p.rev.clone()) else {
                done(&mut st, None);
                return;
            };
            if let Err(refused) = self.admission.admit(rev.memory_mb()) {
                done(&mut st, Some(format!("the node has no room for another instance: {refused:?}")));
                return;
            }
            st.live += 1;
            rev
        };
        self.update_alive_gauge();
        let (job_rev, name, paging) = (rev.clone(), f.name.clone(), self.cfg.paging);
        let started = self.instance_workers.run(move || start_instance(&job_rev, paging, &name, Some(version), false, false, None, None)).await;
        let mut st = f.lock();
        match started {
            Ok((Ok(inst), _))
                if !st.deleted
                    && !self.shutting_down.load(std::sync::atomic::Ordering::Acquire)
                    && st.versions.get(&version).is_some_and(|p| Arc::ptr_eq(&p.rev, &rev)) =>
            {
                st.idle.push(Idle { inst, rev, since: Instant::now(), given_back: false });
                done(&mut st, None);
                drop(st);
                self.metrics.instances_idle.inc();
                info!(function = %f.name, version, "provisioned instance ready");
            }
            Ok((Ok(inst), _)) => {
                st.live -= 1;
                done(&mut st, None);
                drop(st);
                self.discard(inst);
            }
            Ok((Err(e), _)) => {
                st.live -= 1;
                done(&mut st, Some(error_chain(&e)));
                drop(st);
                self.admission.release(rev.memory_mb());
                self.update_alive_gauge();
                warn!(function = %f.name, version, error = %error_chain(&e), "provisioning an instance failed");
            }
            Err(e) => {
                st.live -= 1;
                done(&mut st, Some(e.to_string()));
                drop(st);
                self.admission.release(rev.memory_mb());
                self.update_alive_gauge();
            }
        }
    }
}
