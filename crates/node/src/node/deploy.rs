//! Deploys: a function's bundle unpacked into a revision directory, functions created
//! and their code updated (a new revision each), retired, and each revision's snapshot
//! built (captured here, or adopted from another node) in the background.

use super::*;

impl Node {
    pub(super) fn new_revision_dir(&self, name: &str) -> PathBuf {
        self.cfg.state_dir.join("revisions").join(format!("{name}-{}", uuid::Uuid::new_v4().simple()))
    }

    /// Unpack `zip` into a new revision directory (off the async threads).
    pub(super) async fn unpack(&self, name: &str, zip: Arc<Vec<u8>>) -> Result<(PathBuf, u64), DeployError> {
        let dir = self.new_revision_dir(name);
        let d = dir.clone();
        let res = tokio::task::spawn_blocking(move || crate::bundle::extract(&zip, &d.join("code"))).await.map_err(DeployError::Join)?;
        match res {
            Ok(n) => Ok((dir, n)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    /// Revision `rev` serves from stored snapshot `adopt` (another node's), if the node
    /// has a store.
    pub(super) fn adopting(&self, rev: &mut RevisionRecord, adopt: Option<String>) {
        if let Some(id) = adopt.filter(|_| self.cfg.snapshot_store.is_some()) {
            (rev.snapshot_id, rev.snapshot_adopted) = (Some(id), true);
        }
    }

    pub(super) fn revision_record(spec: &FunctionSpec, dir: PathBuf, sha: &str, size: u64) -> RevisionRecord {
        RevisionRecord {
            id: 0,
            function: spec.name.clone(),
            code_sha256: sha.to_string(),
            code_size: size,
            dir,
            runtime: spec.runtime.clone(),
            handler: spec.handler.clone(),
            memory_mb: spec.memory_mb,
            env: spec.env.clone(),
            status: "building".into(),
            error: None,
            snapshot_bytes: None,
            snapshot_id: None,
            snapshot_adopted: false,
            layers: spec.layers.clone(),
        }
    }

    /// Give the revision in `dir` (code in `dir/code`, `code_bytes` of it) its `opt/`:
    /// `layers` resolved and extracted in order. `dir` is removed on failure.
    pub(super) async fn add_layers(&self, dir: &Path, layers: &[String], code_bytes: u64) -> Result<(), DeployError> {
        if layers.is_empty() {
            return Ok(());
        }
        let res = match self.resolve_layers(layers) {
            Ok(recs) => self.materialize_layers(recs, dir.join("opt"), code_bytes).await,
            Err(e) => Err(e),
        };
        res.map_err(|e| {
            let _ = std::fs::remove_dir_all(dir);
            e.into()
        })
    }

    /// Copy the `opt/` of revision `from` (if it has one) into the new revision `dir`
    /// (its layers unchanged). `dir` is removed on failure.
    pub(super) async fn copy_layers(&self, name: &str, from: Option<i64>, dir: &Path) -> Result<(), DeployError> {
        let Some(src) = from.and_then(|id| self.registry.get_revision(id).ok().flatten()).map(|r| r.dir.join("opt")) else {
            return Ok(());
        };
        if !src.is_dir() {
            return Ok(());
        }
        let dst = dir.join("opt");
        let copied = tokio::task::spawn_blocking(move || crate::bundle::overlay_tree(&src, &dst)).await.map_err(DeployError::Join)?;
        copied.map(|_| ()).map_err(|source| {
            let _ = std::fs::remove_dir_all(dir);
            DeployError::Copy { name: name.to_string(), source }
        })
    }

    /// CreateFunction: unpack, register as Pending, build the snapshot in the background.
    pub async fn create_function(self: &Arc<Self>, spec: FunctionSpec, zip: Vec<u8>) -> Result<FunctionRecord, DeployError> {
        self.create_function_adopting(spec, zip, None).await
    }

    /// [`Node::create_function`] serving from `adopt`, a stored snapshot another node
    /// published of this very function (same bundle and configuration: a cluster's
    /// builder), instead of capturing one: the build fetches and opens it, and
    /// captures only if it does not serve here (another bundle, a store down). The
    /// node never deletes or replaces an adopted snapshot. Without a store, `adopt`
    /// is ignored.
    pub async fn create_function_adopting(self: &Arc<Self>, spec: FunctionSpec, zip: Vec<u8>, adopt: Option<String>) -> Result<FunctionRecord, DeployError> {
        if self.function(&spec.name).is_some() {
            return Err(DeployError::Exists(spec.name));
        }
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let (dir, code_bytes) = self.unpack(&spec.name, Arc::new(zip)).await?;
        self.add_layers(&dir, &spec.layers, code_bytes).await?;
        let mut rev = Self::revision_record(&spec, dir.clone(), &sha, size);
        self.adopting(&mut rev, adopt);
        let rec = FunctionRecord {
            name: spec.name.clone(),
            runtime: spec.runtime.clone(),
            role: spec.role.clone(),
            handler: spec.handler.clone(),
            description: spec.description.clone(),
            timeout_s: spec.timeout_s,
            memory_mb: spec.memory_mb,
            env: spec.env.clone(),
            state: "Pending".into(),
            state_reason: Some("The function is being created.".into()),
            state_reason_code: Some("Creating".into()),
            last_update_status: "InProgress".into(),
            last_update_status_reason: Some("The function is being created.".into()),
            last_update_status_reason_code: Some("Creating".into()),
            last_modified: timestamp(),
            revision_id: uuid::Uuid::new_v4().to_string(),
            code_sha256: sha,
            code_size: size,
            latest_revision: None,
            active_revision: None,
            layers: spec.layers.clone(),
        };
        let f = {
            let mut map = self.functions_map();
            if map.contains_key(&spec.name) {
                drop(map);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(DeployError::Exists(spec.name));
            }
            let f = Arc::new(Function {
                name: spec.name.clone(),
                st: Mutex::new(FnState {
                    rec: rec.clone(),
                    active: None,
                    idle: Vec::new(),
                    live: 0,
                    busy: 0,
                    building: Some(dir.clone()),
                    deleted: false,
                    counters: FunctionCounters::default(),
                    settings: FunctionSettings::default(),
                    versions: BTreeMap::new(),
                    aliases: BTreeMap::new(),
                    provisioned: BTreeMap::new(),
                }),
            });
            map.insert(spec.name.clone(), f.clone());
            f
        };
        let persisted = (|| {
            rev.id = self.registry.insert_revision(&rev)?;
            let mut st = f.lock();
            st.rec.latest_revision = Some(rev.id);
            self.registry.insert_function(&st.rec)?;
            Ok::<_, RegistryError>(st.rec.clone())
        })();
        match persisted {
            Ok(rec) => {
                info!(function = %spec.name, revision = rev.id, "function created; building its snapshot");
                self.spawn_build(f, rev);
                Ok(rec)
            }
            Err(e) => {
                self.functions_map().remove(&spec.name);
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    /// UpdateFunctionCode: unpack, mark InProgress, build; the old revision serves meanwhile.
    pub async fn update_code(self: &Arc<Self>, name: &str, zip: Vec<u8>) -> Result<FunctionRecord, DeployError> {
        self.update_code_adopting(name, zip, None).await
    }

    /// [`Node::update_code`] serving the new revision from `adopt`, a stored snapshot
    /// of it another node published (see [`Node::create_function_adopting`]).
    pub async fn update_code_adopting(self: &Arc<Self>, name: &str, zip: Vec<u8>, adopt: Option<String>) -> Result<FunctionRecord, DeployError> {
        let f = self.function(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        if f.lock().building.is_some() {
            return Err(DeployError::InProgress(self.arn(name)));
        }
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let (dir, _) = self.unpack(name, Arc::new(zip)).await?;
        let latest = {
            let st = f.lock();
            st.rec.latest_revision.or(st.rec.active_revision)
        };
        self.copy_layers(name, latest, &dir).await?;
        self.start_revision(f, dir, sha, size, adopt, |_| {})
    }

    /// Register a new revision of `f` (its code unpacked in `dir`, its configuration
    /// the current one changed by `change`) and build its snapshot in the background;
    /// the active revision keeps serving until the new one is ready. `dir` is removed
    /// on failure.
    /// `adopt`: serve it from this stored snapshot another node published (see
    /// [`Node::create_function_adopting`]).
    pub(super) fn start_revision(
        self: &Arc<Self>,
        f: Arc<Function>,
        dir: PathBuf,
        sha: String,
        size: u64,
        adopt: Option<String>,
        change: impl FnOnce(&mut FunctionSpec),
    ) -> Result<FunctionRecord, DeployError> {
        let name = f.name.as_str();
        let mut st = f.lock();
        if st.deleted {
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DeployError::NotFound(self.arn(name)));
        }
        if st.building.is_some() {
            drop(st);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DeployError::InProgress(self.arn(name)));
        }
        let mut spec = FunctionSpec {
            name: name.to_string(),
            runtime: st.rec.runtime.clone(),
            role: st.rec.role.clone(),
            handler: st.rec.handler.clone(),
            description: st.rec.description.clone(),
            timeout_s: st.rec.timeout_s,
            memory_mb: st.rec.memory_mb,
            env: st.rec.env.clone(),
            layers: st.rec.layers.clone(),
        };
        change(&mut spec);
        let mut rev = Self::revision_record(&spec, dir.clone(), &sha, size);
        self.adopting(&mut rev, adopt);
        let res = self.registry.insert_revision(&rev);
        let id = match res {
            Ok(id) => id,
            Err(e) => {
                drop(st);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        rev.id = id;
        let prev = st.rec.clone();
        st.rec.runtime = spec.runtime;
        st.rec.role = spec.role;
        st.rec.handler = spec.handler;
        st.rec.description = spec.description;
        st.rec.timeout_s = spec.timeout_s;
        st.rec.memory_mb = spec.memory_mb;
        st.rec.env = spec.env;
        st.rec.layers = spec.layers;
        st.rec.code_sha256 = sha;
        st.rec.code_size = size;
        st.rec.latest_revision = Some(id);
        st.rec.last_modified = timestamp();
        st.rec.revision_id = uuid::Uuid::new_v4().to_string();
        st.rec.last_update_status = "InProgress".into();
        st.rec.last_update_status_reason = Some("The function is being updated.".into());
        st.rec.last_update_status_reason_code = None;
        if st.active.is_none() {
            st.rec.state = "Pending".into();
            st.rec.state_reason = Some("The function is being created.".into());
            st.rec.state_reason_code = Some("Creating".into());
        }
        if let Err(e) = self.registry.update_function(&st.rec) {
            st.rec = prev;
            drop(st);
            let _ = self.registry.delete_revision(id);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        st.building = Some(dir);
        let rec = st.rec.clone();
        drop(st);
        info!(function = %name, revision = id, "function updated; building its snapshot");
        self.spawn_build(f.clone(), rev);
        Ok(rec)
    }

    /// DeleteFunction: forget it, discard its idle instances, remove its files when unused.
    pub fn delete_function(&self, name: &str) -> Result<(), DeployError> {
        let f = self.functions_map().remove(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        let (idle, active, building) = {
            let mut st = f.lock();
            st.deleted = true;
            let idle: Vec<Idle> = st.idle.drain(..).collect();
            st.live -= idle.len();
            for p in std::mem::take(&mut st.versions).into_values() {
                p.rev.retire();
            }
            (idle, st.active.take(), st.building.clone())
        };
        self.metrics.instances_idle.sub(idle.len() as i64);
        for i in idle {
            self.discard(i.inst);
        }
        let dirs = self.registry.delete_function(name)?.unwrap_or_default();
        if let Some(a) = &active {
            self.metrics.snapshot_bytes.sub(a.snapshot_bytes() as i64);
            a.retire();
        }
        for d in dirs {
            if Some(&d) != active.as_ref().map(|a| &a.dir) && Some(&d) != building.as_ref() {
                let _ = std::fs::remove_dir_all(&d);
            }
        }
        self.metrics.events_pending.set(self.registry.pending_events().unwrap_or(0) as i64);
        info!(function = %name, "function deleted");
        Ok(())
    }

    pub(super) fn spawn_build(self: &Arc<Self>, f: Arc<Function>, rev: RevisionRecord) {
        self.spawn_build_for(f, rev, None);
    }

    /// [`Node::spawn_build`] of a revision that becomes published version `version`
    /// when ready (None: the active revision, $LATEST).
    pub(super) fn spawn_build_for(self: &Arc<Self>, f: Arc<Function>, rev: RevisionRecord, version: Option<crate::registry::VersionRecord>) {
        let node = self.clone();
        self.builds.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            node.build(f, rev, version).await;
            node.builds.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Boot the revision once, capture it, and make it the active one (or, with
    /// `version`, that published version; $LATEST is left as it is).
    pub(super) async fn build(self: &Arc<Self>, f: Arc<Function>, rec: RevisionRecord, version: Option<crate::registry::VersionRecord>) {
        let rev = Arc::new(Revision::new(&rec, &f.name, &self.cfg));
        let t0 = Instant::now();
        let job_rev = rev.clone();
        let bases = self.cfg.bases.clone();
        let (node, rev_id) = (self.clone(), rec.id);
        let result = self
            .build_workers
            .run(move || -> Result<(u64, Option<String>), InstanceError> {
                if job_rev.snapshot.adopted() {
                    let id = job_rev.snapshot.stored_id().unwrap_or_default();
                    match job_rev.loaded() {
                        Ok(snap) => {
                            let bytes = dir_size(&snap.dir);
                            snap.prepare_sandboxes(0, Duration::ZERO);
                            node.metrics.snapshot_builds.with_label_values(&["adopted"]).inc();
                            info!(snapshot = %id, ms = t0.elapsed().as_secs_f64() * 1e3, "serving the stored snapshot another node published: no capture");
                            return Ok((bytes, None));
                        }
                        Err(e) => {
                            warn!(snapshot = %id, error = %e, "the stored snapshot another node published does not serve here; capturing one");
                            job_rev.snapshot.unadopt();
                            let _ = node.registry.set_snapshot_id(rev_id, None);
                        }
                    }
                }
                if !job_rev.boot.runtime.snapshots() {
                    // A custom runtime: boot once so an init error fails the deploy, as
                    // for the others; its instances are cold-booted (see `start_instance`).
                    Instance::boot(&job_rev.boot)?.kill();
                    info!(boot_ms = t0.elapsed().as_secs_f64() * 1e3, runtime = job_rev.boot.runtime.name(), "init checked; this runtime is served by cold boots (no snapshot)");
                    return Ok((0, None));
                }
                let snapdir = job_rev.snapshot_dir();
                let _ = std::fs::remove_dir_all(&snapdir);
                let (dir, stats) = layered::capture(&job_rev.boot, &snapdir, bases.as_ref())?;
                node.metrics.snapshot_builds.with_label_values(&["captured"]).inc();
                let bytes = dir_size(&dir);
                info!(boot_capture_ms = t0.elapsed().as_secs_f64() * 1e3, pages = stats.pages_stored, bytes, "snapshot captured");
                let stored = job_rev.snapshot.publish().and_then(|r| {
                    r.inspect_err(|e| warn!(error = %error_chain(e), "publishing the snapshot failed; it serves from this node's disk and is published at the next start"))
                        .ok()
                });
                // Open it here so the first invocation does not pay for it, and have its
                // sandboxes prepared (if the node keeps a pool) so its first cold start
                // takes one.
                match job_rev.loaded() {
                    Ok(snap) => drop(snap.prepare_sandboxes(0, Duration::ZERO)),
                    Err(e) => warn!(error = %e, "opening the new snapshot"),
                }
                Ok((bytes, stored))
            })
            .await;
        let result = match result {
            Ok(r) => r.map_err(|e| {
                let code = if matches!(e, InstanceError::Init(_)) { "FunctionError" } else { "InternalError" };
                let reason = match &e {
                    InstanceError::Init(fe) => format!("{}: {}", fe.error_type, fe.error_message),
                    other => error_chain(other),
                };
                (code, reason)
            }),
            Err(e) => Err(("InternalError", error_chain(&e))),
        };
        let mut st = f.lock();
        st.building = None;
        if st.deleted {
            rev.retire();
            return;
        }
        if let Ok((bytes, stored)) = &result {
            let _ = self.registry.finish_revision(rec.id, "ready", None, Some(*bytes));
            if let Some(id) = stored {
                let _ = self.registry.set_snapshot_id(rec.id, Some(id));
            }
            rev.snapshot_bytes.store(*bytes, Ordering::Release);
        }
        match (result, version) {
            (Ok((bytes, _)), Some(v)) => {
                if let Err(e) = self.registry.insert_version(&v) {
                    drop(st);
                    warn!(function = %f.name, version = v.version, error = %error_chain(&e), "recording a version built for the registry");
                    let _ = self.registry.delete_revision(rec.id);
                    rev.retire();
                    return;
                }
                self.metrics.snapshot_bytes.add(bytes as i64);
                st.versions.insert(v.version, super::versions::Published { rec: v.clone(), rev });
                info!(function = %f.name, version = v.version, revision = rec.id, ms = t0.elapsed().as_secs_f64() * 1e3, "version built and published");
            }
            (Err((_, reason)), Some(v)) => {
                drop(st);
                let _ = self.registry.delete_revision(rec.id);
                rev.retire();
                warn!(function = %f.name, version = v.version, revision = rec.id, reason = %reason, "building a version failed");
            }
            (Ok((bytes, _)), None) => {
                st.rec.state = "Active".into();
                st.rec.state_reason = None;
                st.rec.state_reason_code = None;
                st.rec.last_update_status = "Successful".into();
                st.rec.last_update_status_reason = None;
                st.rec.last_update_status_reason_code = None;
                st.rec.active_revision = Some(rec.id);
                self.metrics.snapshot_bytes.add(bytes as i64);
                let old = st.active.replace(rev);
                // The old revision's idle instances go, unless a published version still
                // serves from it (its revision then stays).
                let old = old.filter(|o| !st.versions.values().any(|p| Arc::ptr_eq(&p.rev, o)));
                let (stale, keep): (Vec<Idle>, Vec<Idle>) = st.idle.drain(..).partition(|i| old.as_ref().is_some_and(|o| Arc::ptr_eq(&i.rev, o)));
                st.idle = keep;
                st.live -= stale.len();
                if let Err(e) = self.registry.update_function(&st.rec) {
                    warn!(function = %f.name, error = %error_chain(&e), "persisting the function");
                }
                drop(st);
                self.metrics.instances_idle.sub(stale.len() as i64);
                for i in stale {
                    self.discard(i.inst);
                }
                if let Some(old) = old {
                    self.metrics.snapshot_bytes.sub(old.snapshot_bytes() as i64);
                    let _ = self.registry.delete_revision(old.id);
                    old.retire();
                }
                info!(function = %f.name, revision = rec.id, ms = t0.elapsed().as_secs_f64() * 1e3, "function active");
            }
            (Err((code, reason)), None) => {
                let _ = self.registry.finish_revision(rec.id, "failed", Some(&reason), None);
                st.rec.last_update_status = "Failed".into();
                st.rec.last_update_status_reason = Some(reason.clone());
                st.rec.last_update_status_reason_code = Some(code.into());
                if st.active.is_none() {
                    st.rec.state = "Failed".into();
                    st.rec.state_reason = Some(reason.clone());
                    st.rec.state_reason_code = Some(code.into());
                }
                if let Err(e) = self.registry.update_function(&st.rec) {
                    warn!(function = %f.name, error = %error_chain(&e), "persisting the function");
                }
                drop(st);
                let _ = self.registry.delete_revision(rec.id);
                rev.retire();
                warn!(function = %f.name, revision = rec.id, reason = %reason, "build failed");
            }
        }
    }
}
