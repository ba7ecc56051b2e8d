//! Encryption at rest (issue "Hardening"): with a node key, a snapshot holds no
//! secret in clear (environment values in memory pages, /tmp written at init,
//! working-set copies), restores in every paging mode with the key, is refused
//! without it or with another key, and a page moved within the image is refused
//! rather than run. A diff on a base is sealed the same way (its base stays clear).

mod common;

use std::path::{Path, PathBuf};

use common::{bundle, ok, scratch, stderr, stdout, thaw, thaw_env};

const SECRET: &str = "S3cr3t-Value-4711";

const HANDLER: &str = r#"
import os
TOKEN = os.environ['SECRET']
with open('/tmp/token.txt', 'w') as f:
    f.write('tmp:' + TOKEN)

def handler(event, context):
    return {'env': TOKEN, 'tmp': open('/tmp/token.txt').read()}
"#;

fn key_file(name: &str) -> PathBuf {
    let dir = scratch().join("keys");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `thaw [--key-file KEY] snapshot create` of the secret-holding function into `out`.
fn create(out: &Path, key: Option<&Path>) {
    // One bundle per snapshot: tests run in parallel, and rewriting a bundle changes it.
    let name = format!("code-{}", out.file_name().unwrap().to_string_lossy());
    let code = bundle(&name, &[("handler.py", HANDLER)]);
    let mut args = vec![];
    if let Some(k) = key {
        args.extend(["--key-file", k.to_str().unwrap()]);
    }
    let env = format!("SECRET={SECRET}");
    args.extend(["snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler"]);
    args.extend(["--env", &env, "--out", out.to_str().unwrap()]);
    ok(thaw(&args));
}

fn restore(snap: &Path, key: Option<&Path>, paging: &str) -> std::process::Output {
    let mut args = vec![];
    if let Some(k) = key {
        args.extend(["--key-file", k.to_str().unwrap()]);
    }
    args.extend(["snapshot", "restore", snap.to_str().unwrap(), "--paging", paging, "--payload", "{}", "--quiet"]);
    thaw(&args)
}

/// Files of `dir` whose bytes contain `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() && std::fs::read(&p).unwrap().windows(needle.len()).any(|w| w == needle) {
            out.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

#[test]
fn a_sealed_snapshot_holds_no_secret_and_restores_only_with_its_key() {
    // The same function without a key: the secret is in clear (what sealing must prevent).
    let clear = scratch().join("snap-clear");
    create(&clear, None);
    ok(restore(&clear, None, "record"));
    let found = files_holding(&clear, SECRET.as_bytes());
    assert!(found.contains(&"pages.img".to_string()) && found.contains(&"state.bin".to_string()), "{found:?}");

    let key = key_file("a.key");
    let snap = scratch().join("snap-sealed");
    create(&snap, Some(&key));
    let mode = std::fs::metadata(&key).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600, "a created key file is private");
    let want = format!(r#"{{"env": "{SECRET}", "tmp": "tmp:{SECRET}"}}"#);
    for paging in ["record", "prefetch", "lazy", "eager", "parallel", "ws-cached"] {
        assert_eq!(stdout(&ok(restore(&snap, Some(&key), paging))).trim(), want, "paging {paging}");
    }
    assert!(snap.join("ws.pages").is_file(), "a working set was recorded");
    // Its compressed copy holds the pages decrypted, compressed, each frame sealed
    // (version 2): a prefetch that reads it (THAW_WS_LZ4=1: a working set this small is
    // read from ws.pages by default, ws::LZ4_READ_FROM) reads fewer bytes than the
    // working set holds.
    let z = std::fs::read(snap.join("ws.lz4")).expect("ws.lz4 written for a sealed working set");
    assert_eq!((&z[..8], u32::from_le_bytes(z[8..12].try_into().unwrap())), (&b"THAWWSZ\0"[..], 2), "sealed frames");
    let stats = scratch().join("sealed-prefetch.json");
    let o = thaw_env(&[("THAW_WS_LZ4", "1")], &["--key-file", key.to_str().unwrap(), "snapshot", "restore", snap.to_str().unwrap(), "--paging", "prefetch", "--payload", "{}", "--quiet", "--stats", stats.to_str().unwrap()]);
    assert_eq!(stdout(&ok(o)).trim(), want);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let (ws_bytes, disk) = (st["prefetch"]["ws_bytes"].as_u64().unwrap(), st["prefetch"]["disk_bytes"].as_u64().unwrap());
    assert!(disk > 0 && disk < ws_bytes / 2, "{disk} bytes read for {ws_bytes}: {st}");
    assert_eq!(files_holding(&snap, SECRET.as_bytes()), Vec::<String>::new(), "no file of a sealed snapshot holds the secret");

    let inspect: serde_json::Value =
        serde_json::from_str(&stdout(&ok(thaw(&["--key-file", key.to_str().unwrap(), "snapshot", "inspect", snap.to_str().unwrap()]))))
            .unwrap();
    let key_id = inspect["sealed_with_key"].as_str().expect("inspect names the sealing key").to_string();
    assert_eq!(key_id.len(), 16);

    // Without a key, or with another one: refused (exit 2), naming the key it needs.
    let o = restore(&snap, None, "prefetch");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("encrypted with node key {key_id}, and this process has no node key")), "{}", stderr(&o));
    let o = restore(&snap, Some(&key_file("b.key")), "lazy");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("encrypted with node key {key_id}, not with this process's node key")), "{}", stderr(&o));
    // THAW_NODE_KEY works like the key file.
    let hex = std::fs::read_to_string(&key).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .env("THAW_DATA_DIR", scratch().join("data"))
        .env("THAW_NODE_KEY", hex.trim())
        .args(["snapshot", "restore", snap.to_str().unwrap(), "--paging", "lazy", "--payload", "{}", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(stdout(&ok(o)).trim(), want);
}

/// Two stored pages swapped (their CRCs swapped too, so only the encryption can
/// tell): the restore refuses the image instead of running on memory it did not provide.
#[test]
fn a_page_moved_within_a_sealed_image_is_refused() {
    use thaw_engine::image::{decode_state, encode_state, PAGES_FILE, STATE_FILE};
    let key = key_file("c.key");
    let snap = scratch().join("snap-forged");
    create(&snap, Some(&key));
    let mut img = decode_state(&snap, &std::fs::read(snap.join(STATE_FILE)).unwrap()).unwrap();
    assert!(img.pages.crcs.len() > 2);
    let (a, b) = (0usize, 1usize);
    let mut pages = std::fs::read(snap.join(PAGES_FILE)).unwrap();
    let pa: Vec<u8> = pages[a * 4096..(a + 1) * 4096].to_vec();
    pages.copy_within(b * 4096..(b + 1) * 4096, a * 4096);
    pages[b * 4096..(b + 1) * 4096].copy_from_slice(&pa);
    img.pages.crcs.swap(a, b);
    std::fs::write(snap.join(PAGES_FILE), &pages).unwrap();
    std::fs::write(snap.join(STATE_FILE), encode_state(&img)).unwrap();
    let o = restore(&snap, Some(&key), "eager");
    assert!(!o.status.success(), "a forged image ran: {}", stdout(&o));
    assert!(stderr(&o).contains("does not authenticate under the node key"), "{}", stderr(&o));
}

/// A diff on a base (layered snapshots) captured with a node key is sealed: the
/// secret is in no file of the diff or of the base (which is never sealed and holds
/// nothing of the function), it restores in every mode with the key, also with its
/// memory shared, and is refused without the key.
#[test]
fn a_sealed_diff_on_a_clear_base_holds_no_secret() {
    let key = key_file("d.key");
    let k = key.to_str().unwrap();
    let data = scratch().join("data-layered");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_thaw")).env("THAW_DATA_DIR", &data).env_remove("THAW_LOG").args(args).output().unwrap()
    };
    let base: serde_json::Value = serde_json::from_str(stdout(&ok(run(&["--key-file", k, "base", "build"]))).trim()).unwrap();
    let base_dir = PathBuf::from(base["dir"].as_str().unwrap());
    let code = bundle("code-sealed-diff", &[("handler.py", HANDLER)]);
    let snap = scratch().join("snap-sealed-diff");
    let env = format!("SECRET={SECRET}");
    let made = stdout(&ok(run(&["--key-file", k, "snapshot", "create", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--env", &env, "--out", snap.to_str().unwrap()])));
    let made: serde_json::Value = serde_json::from_str(made.trim()).unwrap();
    assert_eq!(made["base"], base["id"], "a diff on the base: {made}");
    let want = format!(r#"{{"env": "{SECRET}", "tmp": "tmp:{SECRET}"}}"#);
    for paging in ["record", "prefetch", "lazy", "eager"] {
        let o = run(&["--key-file", k, "snapshot", "restore", snap.to_str().unwrap(), "--paging", paging, "--payload", "{}", "--quiet"]);
        assert_eq!(stdout(&ok(o)).trim(), want, "paging {paging}");
        let o = run(&["--key-file", k, "snapshot", "restore", snap.to_str().unwrap(), "--paging", paging, "--share-memory", "--payload", "{}", "--quiet"]);
        assert_eq!(stdout(&ok(o)).trim(), want, "paging {paging}, shared memory");
    }
    assert!(snap.join("ws.pages").is_file());
    assert_eq!(files_holding(&snap, SECRET.as_bytes()), Vec::<String>::new(), "no file of the sealed diff holds the secret");
    assert_eq!(files_holding(&base_dir, SECRET.as_bytes()), Vec::<String>::new(), "nor of its base");
    let o = run(&["snapshot", "restore", snap.to_str().unwrap(), "--paging", "lazy", "--payload", "{}", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "without the key: refused");
}

/// A sealed snapshot whose working set arrived without its compressed copy (a store
/// writes none for a sealed image): the node, which holds the key, makes sealed
/// frames beside it (`LoadedSnapshot::compress_working_set`), and a prefetch then
/// reads them.
#[test]
fn a_sealed_working_set_that_arrived_without_ws_lz4_gets_sealed_frames_from_the_key_holder() {
    let key = key_file("c.key");
    let snap = scratch().join("snap-sealed-arrived");
    create(&snap, Some(&key));
    ok(restore(&snap, Some(&key), "record"));
    std::fs::remove_file(snap.join("ws.lz4")).expect("written with the working set");
    let hex = std::fs::read_to_string(&key).unwrap();
    thaw_engine::seal::install(Some(std::sync::Arc::new(thaw_engine::seal::NodeKey::from_hex(hex.trim(), "the key file").unwrap())));
    let loaded = thaw_engine::instance::LoadedSnapshot::open(&snap).unwrap();
    assert!(loaded.compress_working_set().unwrap(), "made");
    assert!(!loaded.compress_working_set().unwrap(), "there already");
    let z = std::fs::read(snap.join("ws.lz4")).unwrap();
    assert_eq!(u32::from_le_bytes(z[8..12].try_into().unwrap()), 2, "sealed frames");
    // A store's sealed zstd frames (version 4, as a publish makes them) are rewritten
    // as LZ4 frames by the key holder (they decode faster from a local disk), and kept
    // by a writer without the key.
    let sealer = thaw_engine::seal::Sealer::open(loaded.image.seal.as_ref().unwrap(), thaw_engine::seal::node_key().as_deref()).unwrap();
    let zstd = thaw_engine::ws::lz4::recompress_zstd(&z, Some(&sealer)).unwrap().expect("smaller");
    std::fs::write(snap.join("ws.lz4"), &zstd).unwrap();
    let set = thaw_engine::ws::WorkingSet::load(&snap, loaded.id).unwrap();
    assert!(!thaw_engine::ws::compress_beside(&snap, &set, None, false).unwrap(), "no key: kept");
    assert_eq!(std::fs::read(snap.join("ws.lz4")).unwrap(), zstd);
    // What a node and a pull call once it arrived: kept too, as this small working set
    // is read from ws.pages (below ws::LZ4_READ_FROM), not from ws.lz4.
    assert!(!set.reads_lz4() && set.pages_bytes() < thaw_engine::ws::LZ4_READ_FROM);
    assert!(!loaded.compress_working_set_if_read().unwrap(), "not read here: kept");
    assert_eq!(std::fs::read(snap.join("ws.lz4")).unwrap(), zstd);
    assert!(loaded.compress_working_set().unwrap(), "rewritten");
    let z = std::fs::read(snap.join("ws.lz4")).unwrap();
    assert_eq!(u32::from_le_bytes(z[8..12].try_into().unwrap()), 2, "sealed LZ4 frames again");
    let stats = scratch().join("sealed-arrived.json");
    let o = thaw_env(&[("THAW_WS_LZ4", "1")], &["--key-file", key.to_str().unwrap(), "snapshot", "restore", snap.to_str().unwrap(), "--paging", "prefetch", "--payload", "{}", "--quiet", "--stats", stats.to_str().unwrap()]);
    assert_eq!(stdout(&ok(o)).trim(), format!(r#"{{"env": "{SECRET}", "tmp": "tmp:{SECRET}"}}"#));
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(st["prefetch"]["disk_bytes"].as_u64().unwrap() < st["prefetch"]["ws_bytes"].as_u64().unwrap() / 2, "{st}");
    assert_eq!(files_holding(&snap, SECRET.as_bytes()), Vec::<String>::new());
}

/// What descriptors carry of a function's data (image format 24): a pipe's buffered
/// bytes, a message queued on a socketpair, a memfd's and a deleted /tmp file's
/// contents travel in state.bin. Without a key they are there in clear (so this test
/// can fail); sealed they are in no file of the snapshot, and the restored function
/// reads them back.
#[test]
fn what_descriptors_carry_is_sealed_too() {
    const HELD: &str = r#"
import os, socket
SECRET = os.environ['FD_SECRET']
r, w = os.pipe()
os.write(w, ('pipe:' + SECRET).encode())
a, b = socket.socketpair()
a.send(('sock:' + SECRET).encode())
m = os.memfd_create('held')
os.write(m, ('memfd:' + SECRET).encode())
d = open('/tmp/deleted.txt', 'w+')
d.write('deleted:' + SECRET)
d.flush()
os.unlink('/tmp/deleted.txt')

def handler(event, context):
    return {'pipe': os.read(r, 100).decode(), 'sock': b.recv(100).decode(),
            'memfd': os.pread(m, 100, 0).decode(), 'deleted': os.pread(d.fileno(), 100, 0).decode()}
"#;
    const FD_SECRET: &str = "Fd-S3cr3t-0815";
    let make = |name: &str, key: Option<&Path>| {
        let code = bundle(&format!("code-{name}"), &[("handler.py", HELD)]);
        let out = scratch().join(name);
        let mut args = vec![];
        if let Some(k) = key {
            args.extend(["--key-file", k.to_str().unwrap()]);
        }
        let env = format!("FD_SECRET={FD_SECRET}");
        args.extend(["snapshot", "create", "--no-base", "--code", code.to_str().unwrap(), "--handler", "handler.handler", "--env", &env, "--out", out.to_str().unwrap()]);
        ok(thaw(&args));
        out
    };
    let want = format!(r#"{{"pipe": "pipe:{FD_SECRET}", "sock": "sock:{FD_SECRET}", "memfd": "memfd:{FD_SECRET}", "deleted": "deleted:{FD_SECRET}"}}"#);
    let clear = make("snap-fds-clear", None);
    let state = std::fs::read(clear.join("state.bin")).unwrap();
    for what in ["pipe", "sock", "memfd", "deleted"] {
        let needle = format!("{what}:{FD_SECRET}");
        assert!(state.windows(needle.len()).any(|w| w == needle.as_bytes()), "a clear state.bin carries {needle}");
    }
    assert_eq!(stdout(&ok(restore(&clear, None, "lazy"))).trim(), want);

    let key = key_file("fds.key");
    let snap = make("snap-fds-sealed", Some(&key));
    assert_eq!(files_holding(&snap, FD_SECRET.as_bytes()), Vec::<String>::new(), "no file of a sealed snapshot holds a descriptor's payload");
    for paging in ["record", "prefetch", "lazy"] {
        assert_eq!(stdout(&ok(restore(&snap, Some(&key), paging))).trim(), want, "paging {paging}");
    }
    assert_eq!(files_holding(&snap, FD_SECRET.as_bytes()), Vec::<String>::new(), "nor once its working set is recorded");
}
