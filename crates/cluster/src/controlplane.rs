//! A real Kubernetes control plane for tests: etcd + kube-apiserver (+ optionally
//! kube-controller-manager running only its garbage collector) on 127.0.0.1, free ports,
//! self-made certificates and tokens.
//!
//! The binaries come from `scripts/build-k8s.sh` (built from the k8s.io/kubernetes Go
//! module, cached in `${THAW_CACHE_DIR:-/var/cache/thaw}/kubernetes-v1.34.4/`, or the
//! directory in `THAW_K8S_DIR`). Starting takes ~5-20 s, so a test binary starts one
//! control plane and shares it ([`ControlPlane::shared`]).
//!
//! Identities:
//! - an admin (static token, group `system:masters`) for setting things up;
//! - service-account tokens minted through the TokenRequest API
//!   ([`ControlPlane::service_account_token`]), bound to a Pod that names its node, as
//!   the kubelet would mint them for an agent pod: the apiserver then reports the node
//!   in the user's extra field `authentication.kubernetes.io/node-name`, which the
//!   agent admission policy checks (deploy/base/agent-rbac.yaml).
//!
//! Every child runs under `setpriv --pdeathsig KILL`, spawned from one thread that never
//! exits, so nothing outlives the test process, even when it is killed.

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};

/// The Kubernetes version `scripts/build-k8s.sh` builds.
pub const K8S_VERSION: &str = "v1.34.4";

#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("{what} not found at {path}: run `bash scripts/build-k8s.sh` (builds etcd, kube-apiserver, kube-controller-manager and kubectl into the cache), or set THAW_K8S_DIR")]
    MissingBinary { what: &'static str, path: PathBuf },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{what} did not become ready within {secs} s; last lines of {log}:\n{tail}")]
    NotReady { what: &'static str, secs: u64, log: PathBuf, tail: String },
    #[error(transparent)]
    Client(#[from] crate::KubeClientError),
    #[error("kubernetes API: {what}")]
    Kube {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },
}

type Result<T> = std::result::Result<T, ControlPlaneError>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let what = what.into();
    move |source| ControlPlaneError::Io { what, source }
}

/// Directory holding etcd, kube-apiserver, kube-controller-manager and kubectl.
pub fn k8s_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("THAW_K8S_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("THAW_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/thaw"));
    cache.join(format!("kubernetes-{K8S_VERSION}"))
}

/// Path of one of the cached binaries, or an error naming scripts/build-k8s.sh.
pub fn binary(what: &'static str) -> Result<PathBuf> {
    let path = k8s_dir().join(what);
    if path.exists() {
        Ok(path)
    } else {
        Err(ControlPlaneError::MissingBinary { what, path })
    }
}

/// Spawns children from one thread that lives as long as the process: a child's
/// parent-death signal fires when the *thread* that forked it exits.
fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("thaw-controlplane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The senders live in a static: never reached; park to be sure.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    cmd.stdin(Stdio::null());
    tx.lock().unwrap_or_else(|e| e.into_inner()).send((cmd, rtx)).expect("spawner thread alive");
    rrx.recv().expect("spawner thread alive")
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("binding a free port"))?;
    Ok(l.local_addr().map_err(io("binding a free port"))?.port())
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(io(format!("running {cmd:?}")))?;
    if !out.status.success() {
        return Err(ControlPlaneError::Command { cmd: format!("{cmd:?}"), stderr: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    Ok(())
}

fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn random_token() -> Result<String> {
    let mut b = [0u8; 16];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).map_err(io("reading /dev/urandom"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Also run kube-controller-manager with only the garbage collector (ownerReference
    /// cascading deletion).
    pub garbage_collector: bool,
    /// The address the apiserver serves on (its certificate names it too); 127.0.0.1
    /// when unset. Tests whose agents run in network namespaces of their own give the
    /// address of the bridge that joins them.
    pub address: Option<std::net::Ipv4Addr>,
}

/// A running etcd + kube-apiserver (+ garbage collector). Stopped on drop.
#[derive(Debug)]
pub struct ControlPlane {
    dir: tempfile::TempDir,
    url: String,
    admin_token: String,
    children: Mutex<Vec<(&'static str, Child)>>,
}

impl ControlPlane {
    /// The control plane shared by every test of this test binary (started on first use,
    /// with the garbage collector). Panics with the reason if it cannot start.
    pub fn shared() -> &'static ControlPlane {
        static CP: OnceLock<ControlPlane> = OnceLock::new();
        CP.get_or_init(|| match ControlPlane::start(Options { garbage_collector: true, ..Options::default() }) {
            Ok(cp) => {
                // A static is never dropped: a janitor removes the directory when the
                // test process exits (its parent-death signal is TERM, which it traps).
                let dir = cp.dir().display().to_string();
                let mut cmd = Command::new("setpriv");
                cmd.args(["--pdeathsig", "TERM", "--", "sh", "-c", "trap 'kill $! 2>/dev/null; sleep 1; rm -rf \"$0\"; exit 0' TERM; while :; do sleep 3600 & wait; done"]);
                cmd.arg(dir).stdout(Stdio::null()).stderr(Stdio::null());
                if let Err(e) = spawn(cmd) {
                    tracing::warn!(error = %e, "no janitor for the control plane's directory");
                }
                cp
            }
            Err(e) => panic!("starting etcd + kube-apiserver: {e}"),
        })
    }

    /// Starts etcd and kube-apiserver and waits until /readyz answers ok.
    pub fn start(opts: Options) -> Result<ControlPlane> {
        let etcd = binary("etcd")?;
        let apiserver = binary("kube-apiserver")?;
        let kcm = if opts.garbage_collector { Some(binary("kube-controller-manager")?) } else { None };
        let dir = tempfile::Builder::new().prefix("thaw-k8s-").tempdir().map_err(io("creating a temp dir"))?;
        let d = dir.path().to_path_buf();
        let p = |f: &str| d.join(f);

        // Certificates: a CA, the apiserver's serving cert for its address, the
        // service-account signing key pair.
        let ossl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(&d));
        ossl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "7", "-subj", "/CN=thaw-test-ca"])?;
        ossl(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver"])?;
        let address = opts.address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        fs::write(p("san.ext"), format!("subjectAltName=IP:{address},IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n")).map_err(io("writing san.ext"))?;
        ossl(&[
            "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "apiserver.crt", "-days", "7",
            "-extfile", "san.ext",
        ])?;
        ossl(&["genrsa", "-out", "sa.key", "2048"])?;
        ossl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
        let admin_token = random_token()?;
        fs::write(p("tokens.csv"), format!("{admin_token},thaw-admin,thaw-admin,\"system:masters\"\n")).map_err(io("writing tokens.csv"))?;

        let (client_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let url = format!("https://{address}:{api_port}");
        let cp = ControlPlane { dir, url, admin_token, children: Mutex::new(Vec::new()) };
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        cp.launch(
            "etcd",
            &etcd,
            &[
                "--name=thaw-test".into(),
                format!("--data-dir={}", p("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=thaw-test=http://127.0.0.1:{peer_port}"),
                "--log-level=warn".into(),
            ],
        )?;
        cp.launch(
            "kube-apiserver",
            &apiserver,
            &[
                format!("--etcd-servers={etcd_url}"),
                format!("--bind-address={address}"),
                format!("--advertise-address={address}"),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", p("certs").display()),
                format!("--tls-cert-file={}", p("apiserver.crt").display()),
                format!("--tls-private-key-file={}", p("apiserver.key").display()),
                format!("--client-ca-file={}", p("ca.crt").display()),
                format!("--token-auth-file={}", p("tokens.csv").display()),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", p("sa.pub").display()),
                format!("--service-account-signing-key-file={}", p("sa.key").display()),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                // The agent DaemonSet is privileged.
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        )?;
        cp.write_kubeconfig(&cp.kubeconfig(), &cp.admin_token)?;
        cp.wait_ready()?;
        if let Some(kcm) = kcm {
            let kc = cp.kubeconfig().display().to_string();
            cp.launch(
                "kube-controller-manager",
                &kcm,
                &[
                    format!("--kubeconfig={kc}"),
                    format!("--authentication-kubeconfig={kc}"),
                    format!("--authorization-kubeconfig={kc}"),
                    "--controllers=garbagecollector".into(),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    "--v=1".into(),
                ],
            )?;
        }
        tracing::info!(url = %cp.url, dir = %cp.dir.path().display(), "control plane ready");
        Ok(cp)
    }

    fn launch(&self, what: &'static str, bin: &Path, args: &[String]) -> Result<()> {
        let log = self.dir.path().join(format!("{what}.log"));
        let out = fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out.try_clone().map_err(io("dup log"))?;
        let mut cmd = Command::new("setpriv");
        cmd.arg("--pdeathsig").arg("KILL").arg("--").arg(bin).args(args).stdout(out).stderr(err);
        let child = spawn(cmd).map_err(io(format!("starting {what} ({})", bin.display())))?;
        self.children.lock().unwrap_or_else(|e| e.into_inner()).push((what, child));
        Ok(())
    }

    /// Polls /readyz from a thread of its own (callers may be inside a runtime).
    fn wait_ready(&self) -> Result<()> {
        std::thread::scope(|s| s.spawn(|| self.poll_ready()).join().expect("readiness thread panicked"))
    }

    fn poll_ready(&self) -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("tokio runtime"))?;
        let deadline = Instant::now() + Duration::from_secs(90);
        let log = self.dir.path().join("kube-apiserver.log");
        loop {
            if let Some(dead) = self.exited() {
                let log = self.dir.path().join(format!("{dead}.log"));
                return Err(ControlPlaneError::NotReady { what: dead, secs: 0, tail: tail(&log, 15), log });
            }
            let ok = rt.block_on(async {
                let client = self.client().await.ok()?;
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client.request_text(req).await.ok()
            });
            if ok.as_deref().map(str::trim) == Some("ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ControlPlaneError::NotReady { what: "kube-apiserver", secs: 90, tail: tail(&log, 15), log });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Name of a child that has exited, if any.
    fn exited(&self) -> Option<&'static str> {
        let mut ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
        ch.iter_mut().find_map(|(w, c)| (!matches!(c.try_wait(), Ok(None))).then_some(*w))
    }

    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin's kubeconfig (for kubectl).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Writes a kubeconfig for this control plane authenticating with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: thaw-test\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
users:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: thaw-test\n  context:\n    cluster: thaw-test\n    user: user\n\
current-context: thaw-test\n",
            self.url,
            self.dir.path().join("ca.crt").display()
        );
        fs::write(path, text).map_err(io(format!("writing {}", path.display())))
    }

    /// A client authenticated as the admin.
    pub async fn client(&self) -> Result<Client> {
        Ok(crate::kube_client(Some(&self.kubeconfig())).await?)
    }

    /// A client authenticated with a bearer `token`.
    pub async fn client_for_token(&self, token: &str) -> Result<Client> {
        let path = self.dir.path().join(format!("user-{}.kubeconfig", random_token()?));
        self.write_kubeconfig(&path, token)?;
        Ok(crate::kube_client(Some(&path)).await?)
    }

    /// Mints a token for service account `namespace/name`. With `pod` = (name, uid) it is
    /// bound to that Pod (which must exist; its `spec.nodeName` becomes the token's node),
    /// as the kubelet does for a pod's projected token.
    pub async fn service_account_token(&self, namespace: &str, name: &str, pod: Option<(&str, &str)>) -> Result<String> {
        let client = self.client().await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec!["https://kubernetes.default.svc".into()],
                bound_object_ref: pod.map(|(pod, uid)| BoundObjectReference {
                    kind: Some("Pod".into()),
                    api_version: Some("v1".into()),
                    name: Some(pod.into()),
                    uid: Some(uid.into()),
                }),
                expiration_seconds: Some(3600),
            },
            ..Default::default()
        };
        let tr = sas
            .create_token_request(name, &PostParams::default(), &req)
            .await
            .map_err(|source| ControlPlaneError::Kube { what: format!("TokenRequest for {namespace}/{name} (pod {pod:?})"), source: Box::new(source) })?;
        Ok(tr.status.map(|s| s.token).unwrap_or_default())
    }

    /// Kills every child (SIGKILL) and waits for them.
    pub fn stop(&self) {
        let mut ch = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for (_, c) in ch.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        ch.clear();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
