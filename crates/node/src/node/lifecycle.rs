//! The node's life: start-up (the registry loaded, functions and revisions reopened,
//! bundles fingerprinted), reaping idle instances, event counters, shutdown, and the
//! status `thaw status` and /thaw/status show.

use super::*;

impl Node {
    /// Open the registry under `cfg.state_dir`, load the functions and resume interrupted builds.
    pub fn start(cfg: NodeConfig) -> Result<Arc<Node>, NodeError> {
        let revisions = cfg.state_dir.join("revisions");
        std::fs::create_dir_all(&revisions).map_err(|source| NodeError::Dir { path: revisions.clone(), source })?;
        let registry = Registry::open(&cfg.state_dir.join("registry.sqlite"))?;
        let admission = Arc::new(Admission::new(cfg.max_instances, cfg.memory_budget_mb));
        let metrics = Metrics::new();
        let base_pool = (cfg.base_pool > 0 && cfg.bases.is_some())
            .then(|| Arc::new(repurpose::BasePool::new(cfg.base_pool, admission.clone(), metrics.base_pool_idle.clone(), cfg.runtime_dir.clone())));
        let node = Arc::new(Node {
            instance_workers: WorkerPool::new("instance", cfg.instance_workers)?,
            admission,
            base_pool,
            build_workers: WorkerPool::new("build", cfg.build_workers)?,
            cfg,
            registry,
            metrics,
            functions: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            builds: AtomicUsize::new(0),
            reserving: Mutex::new(()),
            events_wake: Notify::new(),
            started: Instant::now(),
        });
        node.load()?;
        Ok(node)
    }

    pub(super) fn load(self: &Arc<Self>) -> Result<(), NodeError> {
        for mut rec in self.registry.list_functions()? {
            let active = match rec.active_revision {
                Some(id) => self.registry.get_revision(id)?.map(|r| Arc::new(Revision::new(&r, &rec.name, &self.cfg))),
                None => None,
            };
            let mut resume = None;
            if let Some(latest) = rec.latest_revision.filter(|l| Some(*l) != rec.active_revision) {
                match self.registry.get_revision(latest)? {
                    Some(r) if r.status == "building" => resume = Some(r),
                    _ => {}
                }
            }
            let versions = self.load_versions(&rec.name, active.as_ref())?;
            let keep: Vec<i64> = [rec.active_revision, resume.as_ref().map(|r| r.id)]
                .into_iter()
                .flatten()
                .chain(versions.values().map(|p| p.rec.revision))
                .collect();
            for (id, dir) in self.registry.other_revisions(&rec.name, &keep)? {
                self.forget_stored(id);
                let _ = std::fs::remove_dir_all(&dir);
                self.registry.delete_revision(id)?;
            }
            if resume.is_none() && rec.last_update_status == "InProgress" {
                // The build it waited for is gone; report it failed rather than pending forever.
                rec.last_update_status = "Failed".into();
                rec.last_update_status_reason = Some("The node restarted while the update was in progress.".into());
                rec.last_update_status_reason_code = Some("InternalError".into());
                if active.is_none() {
                    rec.state = "Failed".into();
                    rec.state_reason = rec.last_update_status_reason.clone();
                    rec.state_reason_code = Some("InternalError".into());
                }
                self.registry.update_function(&rec)?;
            }
            if let Some(a) = &active {
                self.metrics.snapshot_bytes.add(a.snapshot_bytes() as i64);
            }
            let name = rec.name.clone();
            let f = Arc::new(Function {
                name: name.clone(),
                st: Mutex::new(FnState {
                    rec,
                    active,
                    idle: Vec::new(),
                    live: 0,
                    busy: 0,
                    building: resume.as_ref().map(|r| r.dir.clone()),
                    deleted: false,
                    counters: FunctionCounters::default(),
                    settings: self.registry.get_settings(&name)?,
                    versions,
                    aliases: self.load_aliases(&name)?,
                    provisioned: self.load_provisioned(&name)?,
                }),
            });
            self.functions_map().insert(name.clone(), f.clone());
            if let Some(r) = resume {
                info!(function = %name, revision = r.id, "resuming an interrupted build");
                self.spawn_build(f, r);
            }
        }
        self.metrics.events_pending.set(self.registry.pending_events()? as i64);
        self.publish_pending();
        self.take_bundle_prints();
        Ok(())
    }

    /// Fingerprint the bundle of every revision that serves, on a thread of its own,
    /// so the first cold start of each after a restart finds it taken (issue #35).
    pub(super) fn take_bundle_prints(&self) {
        let revs: Vec<Arc<Revision>> = self
            .functions_map()
            .values()
            .flat_map(|f| {
                let st = f.lock();
                st.active.iter().chain(st.versions.values().map(|p| &p.rev)).filter(|r| r.boot.runtime.snapshots()).cloned().collect::<Vec<_>>()
            })
            .collect();
        if revs.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new().name("thaw-bundle-prints".into()).spawn(move || {
            let t0 = Instant::now();
            for r in &revs {
                if let Err(e) = r.snapshot.bundle.take() {
                    warn!(revision = r.id, error = %e, "cannot fingerprint a revision's bundle; its snapshot will not open");
                }
            }
            debug!(revisions = revs.len(), ms = t0.elapsed().as_secs_f64() * 1e3, "bundles fingerprinted");
        });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start fingerprinting bundles; each is fingerprinted when first opened");
        }
    }

    pub fn note_event(&self, name: &str, done: bool) {
        if let Some(f) = self.function(name) {
            let mut st = f.lock();
            if done {
                st.counters.events_done += 1;
            } else {
                st.counters.events_dropped += 1;
            }
        }
    }

    /// Destroy instances idle for longer than the keep-alive.
    pub fn reap_idle(self: &Arc<Self>) {
        if self.cfg.snapshot_store.is_some() {
            self.settle_lazy_snapshots();
            self.publish_working_sets();
        }
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        for f in fs {
            let expired: Vec<Idle> = {
                let mut st = f.lock();
                let keep = self.cfg.keep_alive;
                let mut held = provisioned::protected(&st).into_iter();
                let (old, fresh): (Vec<Idle>, Vec<Idle>) =
                    st.idle.drain(..).partition(|i| !held.next().unwrap_or(false) && i.since.elapsed() >= keep);
                st.idle = fresh;
                st.live -= old.len();
                old
            };
            self.give_back_idle(&f);
            if !expired.is_empty() {
                debug!(function = %f.name, n = expired.len(), "keep-alive expired");
                self.metrics.instances_idle.sub(expired.len() as i64);
                for i in expired {
                    // One that came from a base goes back to its pool, reset.
                    let left = match &self.base_pool {
                        Some(p) => p.retire(i.inst, &self.instance_workers),
                        None => Some(i.inst),
                    };
                    if let Some(inst) = left {
                        self.discard(inst);
                    }
                }
            }
            if self.cfg.snapshot_store.is_some() {
                // Unpin cached snapshots nothing has used for a keep-alive period (after
                // publishing any working set a restore recorded in them).
                let st = f.lock();
                for rev in st.active.iter().chain(st.versions.values().map(|p| &p.rev)) {
                    if rev.snapshot.close_if_unused(self.cfg.keep_alive) {
                        debug!(function = %f.name, revision = rev.id, "closed an unused stored snapshot");
                    }
                }
            }
        }
    }

    /// Give back the unchanged pages of `f`'s instances idle for `--give-back-after`,
    /// once per idle period (see `thaw_engine::giveback`), on the instance workers.
    /// Each is out of the idle list meanwhile (a call finds another or starts one),
    /// then back; one whose give-back failed was killed and is discarded.
    fn give_back_idle(self: &Arc<Self>, f: &Arc<Function>) {
        let Some(after) = self.cfg.give_back_after else {
            return;
        };
        let due: Vec<Idle> = {
            let mut st = f.lock();
            let (due, rest): (Vec<Idle>, Vec<Idle>) = st.idle.drain(..).partition(|i| !i.given_back && i.since.elapsed() >= after);
            st.idle = rest;
            due
        };
        self.metrics.instances_idle.sub(due.len() as i64);
        for idle in due {
            let slot = Arc::new(Mutex::new(Some(idle)));
            let (node, func, s2) = (self.clone(), f.clone(), slot.clone());
            let queued = self.instance_workers.spawn(move || {
                if let Some(mut idle) = s2.lock().ok().and_then(|mut g| g.take()) {
                    let r = idle.inst.give_back();
                    node.back_from_give_back(&func, idle, r);
                }
            });
            if queued.is_err() {
                // No worker took it: back as it was, not tried again this idle period.
                if let Some(idle) = slot.lock().ok().and_then(|mut g| g.take()) {
                    self.back_from_give_back(f, idle, Ok(Default::default()));
                }
            }
        }
    }

    /// An idle instance back from its give-back: to the idle list, or discarded (its
    /// give-back failed, or its function changed or is gone meanwhile).
    fn back_from_give_back(&self, f: &Arc<Function>, mut idle: Idle, r: Result<thaw_engine::giveback::GiveBackStats, InstanceError>) {
        let mut st = f.lock();
        idle.given_back = true;
        match &r {
            Ok(g) => {
                st.counters.give_backs += 1;
                st.counters.pages_given_back += g.given_back;
                self.metrics.pages_given_back.inc_by(g.given_back);
                debug!(function = %f.name, pages = g.given_back, copied = g.copied, ms = g.ms, "gave back an idle instance's unchanged pages");
            }
            Err(e) => warn!(function = %f.name, error = %error_chain(e), "giving back an idle instance's unchanged pages failed; it was discarded"),
        }
        self.keep_idle_or_discard(st, idle, r.is_ok());
    }

    /// Stop taking invocations and kill every idle instance (in-flight ones are discarded as they finish).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        for f in fs {
            let idle: Vec<Idle> = {
                let mut st = f.lock();
                let v: Vec<Idle> = st.idle.drain(..).collect();
                st.live -= v.len();
                v
            };
            self.metrics.instances_idle.sub(idle.len() as i64);
            for i in idle {
                self.discard(i.inst);
            }
        }
        for inst in self.base_pool.iter().flat_map(|p| p.drain()) {
            self.discard(inst);
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    pub fn instances_alive(&self) -> usize {
        self.admission.instances()
    }

    pub fn builds_running(&self) -> usize {
        self.builds.load(Ordering::Acquire)
    }

    /// Wait for the kill jobs and builds to finish, then stop the worker threads.
    pub fn finish_shutdown(&self) {
        self.build_workers.shutdown();
        self.instance_workers.shutdown();
    }

    /// The `/thaw/status` document.
    pub fn status(&self) -> serde_json::Value {
        let fs: Vec<Arc<Function>> = self.functions_map().values().cloned().collect();
        let mut funcs: Vec<serde_json::Value> = fs
            .iter()
            .map(|f| {
                let st = f.lock();
                let snap = st.active.as_ref().filter(|a| a.boot.runtime.snapshots()).map(|a| {
                    serde_json::json!({
                        "revision": a.id,
                        "dir": a.dir.join("snapshot"),
                        "bytes": a.snapshot_bytes(),
                        "loaded": a.snapshot.is_open(),
                        "stored": a.snapshot.stored_id(),
                        "fetch": a.snapshot.fetch_status(),
                    })
                });
                serde_json::json!({
                    "name": f.name,
                    "state": st.rec.state,
                    "last_update_status": st.rec.last_update_status,
                    "state_reason": st.rec.state_reason,
                    "memory_mb": st.rec.memory_mb,
                    "timeout_s": st.rec.timeout_s,
                    "instances": {"live": st.live, "busy": st.busy, "idle": st.idle.len()},
                    "building": st.building.is_some(),
                    "snapshot": snap,
                    "cold_start": if st.active.as_ref().is_some_and(|a| !a.boot.runtime.snapshots()) { "boot" } else { "restore" },
                    "cold_start_costs": st.active.as_ref().map(|a| a.start_costs.status()),
                    "counters": st.counters,
                })
            })
            .collect();
        funcs.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        serde_json::json!({
            "node": {
                "pid": std::process::id(),
                "uptime_s": self.started.elapsed().as_secs_f64(),
                "state_dir": self.cfg.state_dir,
                "instances_alive": self.instances_alive(),
                "max_instances": self.cfg.max_instances,
                "memory_committed_mb": self.admission.memory_mb(),
                "memory_budget_mb": self.admission.budget_mb(),
                "max_per_function": self.cfg.max_per_function,
                "keep_alive_s": self.cfg.keep_alive.as_secs_f64(),
                "give_back_after_s": self.cfg.give_back_after.map(|d| d.as_secs_f64()),
                "paging": self.cfg.paging,
                "builds_running": self.builds_running(),
                "shutting_down": self.is_shutting_down(),
            },
            "events": {"pending": self.registry.pending_events().unwrap_or(0)},
            "snapshot_store": self.cfg.snapshot_store.as_ref().map(|s| s.status()),
            "bases": self.cfg.bases.as_ref().map(layered::describe),
            "sandbox_pool": self.cfg.sandbox_pool.as_ref().map(|p| p.stats()),
            "network_namespaces": thaw_sandbox::netns_stats(),
            "base_pool": self.base_pool.as_ref().map(|p| p.status()),
            "functions": funcs,
        })
    }
}
