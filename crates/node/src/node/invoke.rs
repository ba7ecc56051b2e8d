//! The invocation path: an instance leased from the function's pool (warm, restored
//! from the revision's snapshot, or booted), invoked, and given back or discarded;
//! the pools' eviction and the node's admission gauges.

use super::*;

impl Node {
    pub(super) fn update_alive_gauge(&self) {
        self.metrics.instances_alive.set(self.admission.instances() as i64);
        self.metrics.memory_committed.set((self.admission.memory_mb() << 20) as i64);
    }

    /// Kill an instance on a worker thread (inline if the pool is gone) and release its slot.
    pub(super) fn discard(&self, inst: Instance) {
        self.admission.release(inst.memory_mb());
        self.update_alive_gauge();
        let slot = Arc::new(Mutex::new(Some(inst)));
        let s2 = slot.clone();
        let queued = self.instance_workers.spawn(move || {
            if let Some(i) = s2.lock().ok().and_then(|mut g| g.take()) {
                i.kill();
            }
        });
        if queued.is_err() {
            if let Some(i) = slot.lock().ok().and_then(|mut g| g.take()) {
                i.kill();
            }
        }
    }

    /// Take one idle instance of another function (the least recently used) to free a node slot.
    pub(super) fn evict_one_idle(&self, except: &str) -> bool {
        let fs: Vec<Arc<Function>> = self.functions_map().values().filter(|f| f.name != except).cloned().collect();
        let mut best: Option<(Arc<Function>, Instant)> = None;
        for f in fs {
            let st = f.lock();
            let held = provisioned::protected(&st);
            if let Some(oldest) = st.idle.iter().zip(&held).find(|(_, h)| !**h).map(|(i, _)| i.since) {
                if best.as_ref().is_none_or(|(_, t)| oldest < *t) {
                    drop(st);
                    best = Some((f, oldest));
                }
            }
        }
        let Some((f, _)) = best else { return false };
        let victim = {
            let mut st = f.lock();
            let held = provisioned::protected(&st);
            let Some(at) = held.iter().position(|h| !h) else { return false };
            st.live -= 1;
            st.idle.remove(at)
        };
        self.metrics.instances_idle.dec();
        debug!(function = %f.name, "evicting an idle instance to make room");
        self.discard(victim.inst);
        true
    }

    /// Discard one clean base instance of the pool (`--base-pool`) to free a node slot.
    fn evict_pooled(&self) -> bool {
        match self.base_pool.as_ref().and_then(|p| p.take_any()) {
            Some(inst) => {
                debug!("evicting a pooled base instance to make room");
                self.discard(inst);
                true
            }
            None => false,
        }
    }

    /// Get an instance: a warm one, or reserve a slot and restore one.
    /// An instance of `f`'s `version`: a warm one, else a new one restored (or, with
    /// `boot`, cold-booted: the retry of a call whose restored instance lost its memory).
    pub async fn acquire(&self, f: &Arc<Function>, version: Option<u64>, boot: bool) -> Result<Lease, InvokeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(InvokeError::ShuttingDown);
        }
        let mut evicted = 0;
        let (rev, isolate, base_file) = loop {
            let mut st = f.lock();
            if st.deleted {
                return Err(InvokeError::NotFound(self.arn(&f.name)));
            }
            let rev = match version {
                None => st.active.clone().ok_or_else(|| InvokeError::NotReady { state: st.rec.state.clone() })?,
                Some(v) => st.versions.get(&v).map(|p| p.rev.clone()).ok_or_else(|| InvokeError::NotFound(format!("{}:{v}", self.arn(&f.name))))?,
            };
            let isolate = st.settings.isolation();
            if st.settings.reserved_concurrency.is_some_and(|r| st.busy >= r as usize) {
                return Err(InvokeError::Throttled { reason: "ReservedFunctionConcurrentInvocationLimitExceeded" });
            }
            // A custom runtime's version is in its bootstrap's environment from its boot
            // on: its warm instances serve that version only. A shim takes it per call.
            let fits = |i: &Idle| Arc::ptr_eq(&i.rev, &rev) && (rev.boot.runtime.snapshots() || i.inst.function_version() == version_label(version));
            if let Some(idle) = st.idle.iter().rposition(fits).filter(|_| !boot).map(|at| st.idle.remove(at)) {
                st.busy += 1;
                st.counters.starts_warm += 1;
                drop(st);
                self.metrics.instances_idle.dec();
                self.metrics.starts.with_label_values(&["warm"]).inc();
                return Ok(Lease { inst: idle.inst, rev: idle.rev, kind: "warm", start_ms: 0.0, isolate });
            }
            if st.live >= self.cfg.max_per_function {
                return Err(InvokeError::Throttled { reason: "ReservedFunctionConcurrentInvocationLimitExceeded" });
            }
            let need_mb = rev.memory_mb();
            if let Err(refused) = self.admission.admit(need_mb) {
                drop(st);
                // Idle instances of other functions make room, least recently used first
                // (as many as the memory needs; each eviction frees a slot and memory).
                let hopeless = matches!(refused, Refused::Memory { budget_mb, .. } if need_mb > budget_mb);
                if !hopeless && evicted < MAX_EVICTIONS_PER_START && (self.evict_one_idle(&f.name) || self.evict_pooled()) {
                    evicted += 1;
                    continue;
                }
                return Err(match refused {
                    Refused::Instances { .. } => InvokeError::Throttled { reason: "ConcurrentInvocationLimitExceeded" },
                    Refused::Memory { need_mb, used_mb, budget_mb } => InvokeError::MemoryBudget { need_mb, used_mb, budget_mb },
                });
            }
            st.live += 1;
            st.busy += 1;
            st.counters.starts_cold += 1;
            st.counters.peak_instances = st.counters.peak_instances.max(st.live);
            // `--shared-memory-file auto`: a function's first instances map their base's
            // memory file (the base counted once across functions), later ones the
            // snapshot's (its diff's pages shared among them too).
            let base_file = self.cfg.shared_memory_auto.then_some(st.live <= AUTO_BASE_FILE_UP_TO);
            break (rev, isolate, base_file);
        };
        self.update_alive_gauge();
        let t0 = Instant::now();
        // A clean base instance to load the function into (repurposing), if the pool has
        // one: it keeps its own reservation, the start's goes back. A pool found empty is
        // refilled in the background (else instances come back to it when idle).
        let pooled = match (&self.base_pool, &self.cfg.bases) {
            (Some(p), Some(b)) if !boot => p.base_for(&rev.boot, &b.dir, isolate).map(|m| (p.clone(), m)),
            _ => None,
        };
        let taken = pooled.as_ref().filter(|_| rev.start_costs.prefer_pool()).and_then(|(p, m)| p.take(m));
        if taken.is_some() {
            self.admission.release(rev.memory_mb());
        }
        if let (Some((p, m)), None) = (&pooled, &taken) {
            p.refill(m, &self.instance_workers);
        }
        let name = f.name.clone();
        let paging = self.cfg.paging;
        let job_rev = rev.clone();
        let started = self
            .instance_workers
            .run(move || -> (Result<Instance, InstanceError>, bool) { start_instance(&job_rev, paging, &name, version, isolate, boot, taken, base_file) })
            .await;
        let start_ms = t0.elapsed().as_secs_f64() * 1e3;
        let failure = match started {
            Ok((Ok(inst), fell_back)) => {
                if fell_back {
                    self.metrics.restore_fallbacks.inc();
                }
                let kind = inst.start.kind;
                rev.start_costs.note(kind, start_ms);
                self.metrics.starts.with_label_values(&[kind]).inc();
                self.metrics.start_seconds.with_label_values(&[kind]).observe(start_ms / 1e3);
                if self.cfg.sandbox_pool.is_some() && kind != "boot" {
                    let outcome = if inst.start.prepared_sandbox { "prepared" } else { "created" };
                    self.metrics.restore_sandboxes.with_label_values(&[outcome]).inc();
                }
                return Ok(Lease { inst, rev, kind, start_ms, isolate });
            }
            Ok((Err(e), _)) => InvokeError::Start { function: f.name.clone(), source: Box::new(e) },
            Err(e) => InvokeError::Workers(e),
        };
        {
            let mut st = f.lock();
            st.live -= 1;
            st.busy -= 1;
        }
        self.admission.release(rev.memory_mb());
        self.update_alive_gauge();
        warn!(function = %f.name, error = %error_chain(&failure), "no instance could be started");
        Err(failure)
    }

    /// Return an instance after an invocation: keep it warm if healthy, else discard it.
    pub fn release(&self, f: &Arc<Function>, lease: Lease, healthy: bool) {
        let mut st = f.lock();
        st.busy -= 1;
        self.keep_idle_or_discard(st, Idle { inst: lease.inst, rev: lease.rev, since: Instant::now(), given_back: false }, healthy);
    }

    /// `idle` into its function's idle list (`st`, locked) if `healthy`, its revision is
    /// still served and the node is not shutting down; else it is discarded and its
    /// slot freed.
    pub(super) fn keep_idle_or_discard(&self, mut st: MutexGuard<'_, FnState>, idle: Idle, healthy: bool) {
        if healthy && st.serves(&idle.rev) && !st.deleted && !self.shutting_down.load(Ordering::Acquire) {
            st.idle.push(idle);
            drop(st);
            self.metrics.instances_idle.inc();
            return;
        }
        st.live -= 1;
        drop(st);
        self.discard(idle.inst);
    }

    /// Run one invocation of `name` (sync API and event dispatcher share this).
    ///
    /// Runs as its own task, so a caller that goes away (client disconnect) cannot
    /// strand an instance or its slot half-way through.
    pub async fn invoke(self: &Arc<Self>, name: &str, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        self.invoke_version(name, InvokeTarget::latest(), request_id, payload).await
    }

    /// [`Node::invoke`] of the version `target` names, reporting the qualifier it was called with.
    pub async fn invoke_version(self: &Arc<Self>, name: &str, target: InvokeTarget, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        let (node, name, rid) = (self.clone(), name.to_string(), request_id.to_string());
        match tokio::spawn(async move { node.invoke_inner(&name, target, &rid, payload).await }).await {
            Ok(r) => r,
            Err(e) => Err(InvokeError::Start {
                function: request_id.to_string(),
                source: Box::new(InstanceError::Io(std::io::Error::other(format!("invoke task failed: {e}")))),
            }),
        }
    }

    pub(super) async fn invoke_inner(&self, name: &str, target: InvokeTarget, request_id: &str, payload: String) -> Result<Invocation, InvokeError> {
        let f = self.function(name).ok_or_else(|| InvokeError::NotFound(self.arn(name)))?;
        let version = target.version;
        let (timeout_s, memory_mb) = {
            let st = f.lock();
            match version.and_then(|v| st.versions.get(&v)) {
                Some(p) => (p.rec.timeout_s, p.rev.memory_mb()),
                None => (st.rec.timeout_s, st.rec.memory_mb),
            }
        };
        // The platform could not give a restored instance its memory (its page server
        // failed: the snapshot's store went down mid-fetch, say). Not the function's
        // fault: the call runs again, once, on a cold boot.
        // Shared, not copied: only the rare retry needs it a second time.
        let payload = Arc::new(payload);
        let mut ran = self.run_once(&f, name, &target, request_id, payload.clone(), timeout_s, false).await?;
        if ran.0.kind != "boot" && matches!(&ran.1, Err(InstanceError::Invoke { page_server: Some(_), .. })) {
            if let Err(e) = &ran.1 {
                warn!(function = %name, request_id, error = %error_chain(e), "a restored instance lost its memory; retrying the call on a cold boot");
            }
            self.metrics.restore_fallbacks.inc();
            self.release(&f, ran.0, false);
            ran = self.run_once(&f, name, &target, request_id, payload, timeout_s, true).await?;
        }
        let (lease, result, invoke_ms, oom, logs, mem, reset) = ran;
        // A snapshot still arriving from the store fetches the rest now.
        lease.rev.snapshot.responded();
        self.metrics.invoke_seconds.with_label_values(&[]).observe(invoke_ms / 1e3);
        let (outcome, healthy) = match result {
            Ok(InvokeOutcome::Ok(text)) if text.len() > MAX_RESPONSE => (
                Outcome::Error(
                    FunctionError {
                        error_type: "Function.ResponseSizeTooLarge".into(),
                        error_message: format!(
                            "Response payload size exceeded maximum allowed payload size ({MAX_RESPONSE} bytes)."
                        ),
                        stack_trace: vec![],
                    },
                    ErrorKind::ResponseTooLarge,
                ),
                true,
            ),
            Ok(InvokeOutcome::Ok(text)) => (Outcome::Ok(text), true),
            Ok(InvokeOutcome::Error(e)) => (Outcome::Error(e, ErrorKind::Handled), true),
            Err(e) => {
                let (kind, err) = classify_failure(&e, oom, request_id, timeout_s, memory_mb);
                warn!(function = %name, request_id, kind = kind.label(), error = %error_chain(&e), "invocation failed; discarding the instance");
                (Outcome::Error(err, kind), false)
            }
        };
        let start_kind = lease.kind;
        let start_ms = lease.start_ms;
        if let Some(ok) = reset {
            let mut st = f.lock();
            if ok {
                st.counters.resets += 1;
            } else {
                st.counters.resets_refused += 1;
            }
            drop(st);
            self.metrics.resets.with_label_values(&[if ok { "done" } else { "refused" }]).inc();
        }
        self.release(&f, lease, healthy && reset != Some(false));
        let label = match &outcome {
            Outcome::Ok(_) => "ok",
            Outcome::Error(_, k) => k.label(),
        };
        self.metrics.invocations.with_label_values(&[name, label]).inc();
        {
            let mut st = f.lock();
            st.counters.invocations += 1;
            if label != "ok" {
                st.counters.errors += 1;
            }
        }
        if label != "ok" {
            self.metrics.errors.with_label_values(&[name, label]).inc();
        }
        debug!(function = %name, request_id, start = start_kind, invoke_ms, outcome = label, "invoked");
        if !logs.is_empty() {
            debug!(function = %name, request_id, logs = %logs.trim_end(), "function output");
        }
        Ok(Invocation {
            request_id: request_id.to_string(),
            outcome,
            logs,
            start_kind,
            start_ms,
            invoke_ms,
            memory_mb,
            max_memory_used_mb: mem.div_ceil(1 << 20),
        })
    }

    /// Take an instance (see [`Node::acquire`]) and run one invocation on it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_once(&self, f: &Arc<Function>, name: &str, target: &InvokeTarget, request_id: &str, payload: Arc<String>, timeout_s: u64, boot: bool) -> Result<Ran, InvokeError> {
        let version = target.version;
        let mut lease = self.acquire(f, version, boot).await?;
        // Per call, never from the image: versions share snapshots and warm instances.
        lease.inst.set_function_version(&target.version_label());
        lease.inst.set_function_arn(&target.invoked_arn(&self.arn(name)));
        let rid = request_id.to_string();
        let timeout = Duration::from_secs(timeout_s);
        let freeze = self.cfg.freeze_idle;
        let reserved_mb = lease.inst.memory_mb();
        let joined = tokio::task::spawn_blocking(move || {
            let mut lease = lease;
            let t = Instant::now();
            let r = lease.inst.invoke(&rid, &payload, timeout);
            let invoke_ms = t.elapsed().as_secs_f64() * 1e3;
            let oom = r.is_err() && lease.inst.oom_killed();
            let logs = lease.inst.take_logs();
            let mem = lease.inst.memory_peak_bytes().unwrap_or(0);
            // Isolation: nothing of this invocation may reach the next one. A reset the
            // engine cannot prove complete kills the instance (it is then discarded and
            // the next call restores a fresh one).
            let reset = (lease.isolate && r.is_ok()).then(|| {
                let done = lease.rev.loaded().map_err(|e| e.to_string()).and_then(|snap| lease.inst.reset(&snap).map_err(|e| error_chain(&e)));
                if let Err(e) = &done {
                    warn!(error = %e, "reset after the invocation refused; discarding the instance");
                }
                done.is_ok()
            });
            // Idle from here on: its threads and children stop until the next invoke
            // thaws it (~0.2 ms each way, measured). A failed freeze leaves it running.
            if freeze && r.is_ok() && reset != Some(false) {
                if let Err(e) = lease.inst.freeze() {
                    warn!(error = %error_chain(&e), "cannot freeze the idle instance; it keeps running");
                }
            }
            (lease, r, invoke_ms, oom, logs, mem, reset)
        })
        .await;
        match joined {
            Ok(v) => Ok(v),
            Err(e) => {
                // The blocking task panicked: the instance is lost with it; free its slot.
                let mut st = f.lock();
                st.busy -= 1;
                st.live -= 1;
                drop(st);
                self.admission.release(reserved_mb);
                self.update_alive_gauge();
                Err(InvokeError::Start {
                    function: name.to_string(),
                    source: Box::new(InstanceError::Io(std::io::Error::other(format!("invoke task failed: {e}")))),
                })
            }
        }
    }
}

/// Restore an instance (falling back to a cold boot). Runs on an instance worker.
/// The invoked ARN and the version are set by each invocation (`invoke_inner`).
/// `cold_boot`: boot without trying the snapshot (not counted as a fallback).
/// `pooled`: a clean instance of the revision's base to serve the function first
/// (repurposing: its diff installed, or the function loaded); if that fails it is
/// killed (its reservation serves the start below).
#[allow(clippy::too_many_arguments)]
pub(super) fn start_instance(
    rev: &Revision,
    paging: Paging,
    name: &str,
    version: Option<u64>,
    isolate: bool,
    cold_boot: bool,
    pooled: Option<(Instance, Arc<LoadedSnapshot>)>,
    base_file: Option<bool>,
) -> (Result<Instance, InstanceError>, bool) {
    if let Some((mut inst, base)) = pooled {
        let mut cfg = rev.boot.clone();
        cfg.function_version = version_label(version);
        // The function's diff on this base, installed (no init), if it is one and the
        // install takes it; else the function is loaded (its init runs).
        // THAW_REPURPOSE=load: always load (the baseline of bench/repurpose.py).
        let install = std::env::var("THAW_REPURPOSE").as_deref() != Ok("load");
        let diff = rev.loaded().ok().filter(|s| install && s.image.base.as_ref().is_some_and(|b| b.state_crc == base.id));
        // Each pool way is measured once, then the cheaper serves (see StartCosts).
        let installs = rev.start_costs.pool_installs(diff.is_some());
        let diff = diff.filter(|_| installs);
        let installed = match diff.map(|d| inst.install_diff(&d, &base)) {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(InstanceError::Install(thaw_engine::repurpose::InstallError::Refused(why)))) => {
                debug!(function = name, revision = rev.id, why, "the function's diff cannot be installed into a base instance; loading it");
                rev.start_costs.install_refused();
                Ok(false)
            }
            Some(Err(e)) => Err(e),
        };
        let started = match installed {
            Ok(true) => Ok(()),
            Ok(false) => inst.load_into(&cfg).map(|_| ()),
            Err(e) => Err(e),
        };
        match started {
            Ok(()) => {
                inst.set_function_name(name);
                inst.set_function_version(&cfg.function_version);
                return (Ok(inst), false);
            }
            Err(e) => {
                warn!(function = name, revision = rev.id, error = %error_chain(&e), "repurposing a base instance for the function failed; restoring it instead");
                inst.kill();
            }
        }
    }
    let snap = if rev.boot.runtime.snapshots() && !cold_boot { Some(rev.loaded()) } else { None };
    match snap {
        None => {}
        Some(Ok(snap)) => {
            snap.set_track_writes(isolate);
            if let Some(on) = base_file {
                snap.set_base_file(on);
            }
            match Instance::restore(&snap, paging) {
                Ok(mut inst) => {
                    inst.set_function_name(name);
                    return (Ok(inst), false);
                }
                Err(e) => warn!(function = name, revision = rev.id, error = %error_chain(&e), "restore failed; falling back to a cold boot"),
            }
        }
        Some(Err(e)) => warn!(function = name, revision = rev.id, error = %e, "snapshot unavailable; falling back to a cold boot"),
    }
    let mut boot = rev.boot.clone();
    boot.function_version = version_label(version);
    let r = Instance::boot(&boot).map(|mut i| {
        i.set_function_name(name);
        i
    });
    (r, !cold_boot)
}

/// Map a broken instance to Lambda's error object.
pub(super) fn classify_failure(e: &InstanceError, oom: bool, request_id: &str, timeout_s: u64, memory_mb: u64) -> (ErrorKind, FunctionError) {
    let fe = |t: &str, m: String| FunctionError { error_type: t.into(), error_message: m, stack_trace: vec![] };
    if matches!(e, InstanceError::Invoke { source: ChannelError::Timeout(_), .. }) {
        let ts = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
        return (
            ErrorKind::Timeout,
            fe("Sandbox.Timedout", format!("{ts} {request_id} Task timed out after {timeout_s}.00 seconds")),
        );
    }
    if oom {
        return (
            ErrorKind::OutOfMemory,
            fe(
                "Runtime.OutOfMemory",
                format!("RequestId: {request_id} Error: Runtime exited with error: signal: killed (the function exceeded its memory limit of {memory_mb} MB)"),
            ),
        );
    }
    let detail = match e {
        InstanceError::Invoke { exit: Some(x), .. } => format!("exited ({x})"),
        _ => "failed".to_string(),
    };
    (ErrorKind::Crash, fe("Runtime.ExitError", format!("RequestId: {request_id} Error: Runtime {detail}: {}", error_chain(e))))
}
