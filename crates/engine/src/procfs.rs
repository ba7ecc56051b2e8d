//! Parsing of /proc/PID files the capture needs. Pure parsing functions are
//! separated from file reads so they are unit-tested without a live process.

use std::io;

use serde::{Deserialize, Serialize};

/// One line of /proc/PID/maps plus the VmFlags of the matching smaps entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    pub dev: String,
    pub inode: u64,
    /// Path or pseudo name (`[heap]`, `[stack]`, `[vdso]`...); empty for anonymous.
    pub name: String,
    /// Two-letter VmFlags from smaps (e.g. "gd" for grows-down).
    pub flags: Vec<String>,
}

impl MapEntry {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Permissions as /proc/PID/maps writes them (`rw-p`).
    pub fn perms(&self) -> String {
        let f = |on: bool, c: char| if on { c } else { '-' };
        [f(self.read, 'r'), f(self.write, 'w'), f(self.exec, 'x'), if self.shared { 's' } else { 'p' }].iter().collect()
    }
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
    pub fn has_flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
    /// Backed by a regular file (as opposed to anonymous or a kernel pseudo mapping).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.name.starts_with('/')
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

/// Parse the text of /proc/PID/maps.
pub fn parse_maps(text: &str) -> Option<Vec<MapEntry>> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        let mut it = line.splitn(6, ' ');
        let range = it.next()?;
        let perms = it.next()?.as_bytes();
        let offset = hex(it.next()?)?;
        let dev = it.next()?.to_string();
        let inode: u64 = it.next()?.parse().ok()?;
        let name = it.next().unwrap_or("").trim_start().to_string();
        let (s, e) = range.split_once('-')?;
        if perms.len() < 4 {
            return None;
        }
        out.push(MapEntry {
            start: hex(s)?,
            end: hex(e)?,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
            shared: perms[3] == b's',
            offset,
            dev,
            inode,
            name,
            flags: Vec::new(),
        });
    }
    Some(out)
}

/// Parse /proc/PID/smaps and return the VmFlags of each mapping, keyed by start.
pub fn parse_smaps_flags(text: &str) -> Vec<(u64, Vec<String>)> {
    let mut out = Vec::new();
    let mut cur: Option<u64> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("VmFlags:") {
            if let Some(s) = cur.take() {
                out.push((s, rest.split_whitespace().map(str::to_string).collect()));
            }
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, _)) = range.split_once('-') {
                if let Some(v) = hex(s) {
                    if !range.contains(':') {
                        cur = Some(v);
                    }
                }
            }
        }
    }
    out
}

/// Memory-layout fields of /proc/PID/stat (see proc(5)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmFields {
    pub start_code: u64,
    pub end_code: u64,
    pub start_stack: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
}

/// Parse /proc/PID/stat (the comm field may contain spaces and parentheses).
/// The fields of /proc/PID/stat from field 3 (state) on: field N is index N-3 (the
/// comm before them may hold spaces and parentheses: the last `)` ends it).
fn stat_fields(text: &str) -> Option<Vec<&str>> {
    Some(text.get(text.rfind(')')? + 2..)?.split_whitespace().collect())
}

pub fn parse_stat(text: &str) -> Option<MmFields> {
    let f = stat_fields(text)?;
    let g = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    Some(MmFields {
        start_code: g(26)?,
        end_code: g(27)?,
        start_stack: g(28)?,
        start_data: g(45)?,
        end_data: g(46)?,
        start_brk: g(47)?,
        arg_start: g(48)?,
        arg_end: g(49)?,
        env_start: g(50)?,
        env_end: g(51)?,
    })
}

/// What a process outside the runtime is judged by (/proc/PID/stat): its state, its
/// process group and session (host pids), and its exit status as a wait returns it
/// (a zombie's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub pgrp: i32,
    pub session: i32,
    pub exit_code: i32,
    /// Scheduling policy (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE...; field 41).
    pub policy: i32,
}

pub fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    let f = stat_fields(text)?;
    let g = |n: usize| -> Option<i32> { f.get(n - 3)?.parse().ok() };
    Some(ProcStat { state: f.first()?.chars().next()?, pgrp: g(5)?, session: g(6)?, exit_code: g(52)?, policy: g(41)? })
}

/// /proc/PID/task/TID/stat's fields the capture uses.
pub fn thread_stat(pid: i32, tid: i32) -> io::Result<ProcStat> {
    parse_proc_stat(&read(pid, &format!("task/{tid}/stat"))?).ok_or_else(|| bad(pid, "task stat"))
}

pub fn proc_stat(pid: i32) -> io::Result<ProcStat> {
    parse_proc_stat(&read(pid, "stat")?).ok_or_else(|| bad(pid, "stat"))
}

/// Fields of /proc/PID/status the capture uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub uid: [u32; 3],
    pub gid: [u32; 3],
    pub groups: Vec<u32>,
    pub umask: u32,
    pub threads: u32,
    /// PIDs in each namespace, outermost first.
    pub nspid: Vec<i32>,
    pub sig_pending: u64,
    pub shared_pending: u64,
    /// Parent's host pid.
    pub ppid: i32,
    /// `State:` (e.g. "S (sleeping)", "Z (zombie)").
    pub state: String,
    /// `Seccomp_filters:`: the seccomp filters the thread runs under.
    pub seccomp_filters: u32,
    /// `RssAnon:` in KiB: resident anonymous memory (private copies of file pages
    /// included; what a capture stores, zero pages aside).
    pub rss_anon_kb: u64,
}

pub fn parse_status(text: &str) -> Option<Status> {
    let mut st = Status::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        let nums = || v.split_whitespace().filter_map(|x| x.parse::<u32>().ok()).collect::<Vec<_>>();
        match k {
            "Uid" => {
                let n = nums();
                st.uid = [*n.first()?, *n.get(1)?, *n.get(2)?];
            }
            "Gid" => {
                let n = nums();
                st.gid = [*n.first()?, *n.get(1)?, *n.get(2)?];
            }
            "Groups" => st.groups = nums(),
            "Umask" => st.umask = u32::from_str_radix(v, 8).ok()?,
            "Threads" => st.threads = v.parse().ok()?,
            "NSpid" => st.nspid = v.split_whitespace().filter_map(|x| x.parse().ok()).collect(),
            "SigPnd" => st.sig_pending = hex(v)?,
            "ShdPnd" => st.shared_pending = hex(v)?,
            "PPid" => st.ppid = v.parse().ok()?,
            "State" => st.state = v.to_string(),
            "Seccomp_filters" => st.seccomp_filters = v.parse().ok()?,
            "RssAnon" => st.rss_anon_kb = v.trim_end_matches("kB").trim().parse().ok()?,
            _ => {}
        }
    }
    Some(st)
}

/// `pos:` and `flags:` (octal) of /proc/PID/fdinfo/N.
pub fn parse_fdinfo(text: &str) -> (u64, u32) {
    let mut pos = 0;
    let mut flags = 0;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("pos:") {
            pos = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("flags:") {
            flags = u32::from_str_radix(v.trim(), 8).unwrap_or(0);
        }
    }
    (pos, flags)
}

fn read(pid: i32, file: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
}

fn bad(pid: i32, file: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("cannot parse /proc/{pid}/{file}"))
}

/// The memory map of `pid` with VmFlags filled in.
pub fn maps(pid: i32) -> io::Result<Vec<MapEntry>> {
    let mut m = parse_maps(&read(pid, "maps")?).ok_or_else(|| bad(pid, "maps"))?;
    let flags = parse_smaps_flags(&read(pid, "smaps")?);
    for (start, f) in flags {
        if let Some(e) = m.iter_mut().find(|e| e.start == start) {
            e.flags = f;
        }
    }
    Ok(m)
}

pub fn stat(pid: i32) -> io::Result<MmFields> {
    parse_stat(&read(pid, "stat")?).ok_or_else(|| bad(pid, "stat"))
}

pub fn status(pid: i32) -> io::Result<Status> {
    parse_status(&read(pid, "status")?).ok_or_else(|| bad(pid, "status"))
}

pub fn auxv(pid: i32) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/auxv"))
}

pub fn exe(pid: i32) -> io::Result<String> {
    Ok(std::fs::read_link(format!("/proc/{pid}/exe"))?.to_string_lossy().into_owned())
}

pub fn personality(pid: i32) -> io::Result<u32> {
    let t = read(pid, "personality")?;
    u32::from_str_radix(t.trim(), 16).map_err(|_| bad(pid, "personality"))
}

/// One open descriptor as /proc shows it.
#[derive(Debug, Clone)]
pub struct FdInfo {
    pub fd: i32,
    /// Link target: a path, `pipe:[ino]`, `socket:[ino]`, `anon_inode:[eventfd]`...
    pub target: String,
    pub pos: u64,
    pub flags: u32,
    /// The whole fdinfo text (epoll registrations, eventfd count...).
    pub info: String,
}

/// Open descriptors of `pid`, sorted by number.
pub fn fds(pid: i32) -> io::Result<Vec<FdInfo>> {
    let mut out = Vec::new();
    for ent in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let ent = ent?;
        let Ok(fd) = ent.file_name().to_string_lossy().parse::<i32>() else { continue };
        let target = std::fs::read_link(ent.path())?.to_string_lossy().into_owned();
        let info = read(pid, &format!("fdinfo/{fd}"))?;
        let (pos, flags) = parse_fdinfo(&info);
        out.push(FdInfo { fd, target, pos, flags, info });
    }
    out.sort_by_key(|x| x.fd);
    Ok(out)
}

/// `tfd`, `events` and `data` of each registration in an epoll fdinfo.
pub fn parse_epoll_items(info: &str) -> Vec<(i32, u32, u64)> {
    let mut out = Vec::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("tfd:") else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let get = |k: &str| f.iter().position(|x| *x == k).and_then(|i| f.get(i + 1)).copied();
        if let (Some(tfd), Some(ev), Some(data)) = (f.first(), get("events:"), get("data:")) {
            if let (Ok(tfd), Some(ev), Some(data)) = (tfd.parse(), hex(ev).map(|v| v as u32), hex(data)) {
                out.push((tfd, ev, data));
            }
        }
    }
    out
}

/// A `key: value` field of an fdinfo text, parsed with `parse`.
/// One POSIX timer as /proc/PID/timers shows it (the time left comes from timer_gettime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerInfo {
    pub id: i32,
    pub signo: i32,
    /// sigev_value as the kernel holds it.
    pub sigval: u64,
    /// SIGEV_SIGNAL (0), SIGEV_NONE (1), with SIGEV_THREAD_ID (4) or'ed in for a thread target.
    pub notify: i32,
    /// The thread or process signalled, as a pid in the reader's namespace.
    pub target: i32,
    pub clockid: i32,
}

/// Parse /proc/PID/timers (blocks of `ID:`, `signal: SIGNO/SIGVAL`, `notify: KIND/pid|tid.N`, `ClockID:`).
pub fn parse_timers(text: &str) -> Option<Vec<TimerInfo>> {
    let mut out = Vec::new();
    let mut cur: Option<TimerInfo> = None;
    for line in text.lines() {
        let (k, v) = line.split_once(':')?;
        let v = v.trim();
        match k {
            "ID" => {
                out.extend(cur.take());
                cur = Some(TimerInfo { id: v.parse().ok()?, signo: 0, sigval: 0, notify: 0, target: 0, clockid: 0 });
            }
            "signal" => {
                let t = cur.as_mut()?;
                let (signo, val) = v.split_once('/')?;
                t.signo = signo.parse().ok()?;
                t.sigval = u64::from_str_radix(val.trim_start_matches("0x"), 16).ok()?;
            }
            "notify" => {
                let t = cur.as_mut()?;
                let (kind, who) = v.split_once('/')?;
                let (scope, n) = who.split_once('.')?;
                t.notify = match kind {
                    "signal" => libc::SIGEV_SIGNAL,
                    "none" => libc::SIGEV_NONE,
                    "thread" => libc::SIGEV_THREAD,
                    _ => return None,
                } | if scope == "tid" { libc::SIGEV_THREAD_ID } else { 0 };
                t.target = n.parse().ok()?;
            }
            "ClockID" => cur.as_mut()?.clockid = v.parse().ok()?,
            _ => {}
        }
    }
    out.extend(cur);
    Some(out)
}

pub fn fdinfo_field(info: &str, key: &str) -> Option<String> {
    info.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_string()))
}

/// Thread ids of `pid`, the leader first.
pub fn tids(pid: i32) -> io::Result<Vec<i32>> {
    let mut t: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_string_lossy().parse().ok())
        .collect();
    t.sort_unstable_by_key(|&x| (x != pid, x));
    Ok(t)
}

/// /proc/PID/task/TID/status of one thread.
pub fn thread_status(pid: i32, tid: i32) -> io::Result<Status> {
    parse_status(&read(pid, &format!("task/{tid}/status"))?).ok_or_else(|| bad(pid, "task status"))
}

/// Thread name of one thread.
pub fn thread_comm(pid: i32, tid: i32) -> io::Result<String> {
    Ok(read(pid, &format!("task/{tid}/comm"))?.trim_end().to_string())
}

/// Look up a socket inode in /proc/PID/net/{tcp,tcp6,udp,udp6} to name it in errors.
pub fn describe_socket(pid: i32, inode: u64) -> Option<String> {
    for (file, kind) in [("net/tcp", "TCP"), ("net/tcp6", "TCP6"), ("net/udp", "UDP"), ("net/udp6", "UDP6")] {
        let Ok(text) = read(pid, file) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(9).and_then(|x| x.parse::<u64>().ok()) == Some(inode) {
                return Some(format!("{kind} socket {} -> {}", f.get(1)?, f.get(2)?));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let text = "55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1234    /usr/bin/python3.11\n\
                    7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]\n\
                    7f0000000000-7f0000001000 rw-s 00000000 00:01 77 /dev/zero (deleted)\n\
                    7f0000002000-7f0000003000 ---p 00000000 00:00 0 \n";
        let m = parse_maps(text).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].start, 0x55d0c0a00000);
        assert!(m[0].read && !m[0].write && !m[0].shared && m[0].is_file());
        assert_eq!(m[0].name, "/usr/bin/python3.11");
        assert_eq!(m[1].name, "[stack]");
        assert!(!m[1].is_file());
        assert!(m[2].shared);
        assert_eq!(m[2].name, "/dev/zero (deleted)");
        assert_eq!(m[3].name, "");
        assert!(!m[3].read);
    }

    #[test]
    fn parses_smaps_flags() {
        let text = "7ffd1000-7ffd2000 rw-p 00000000 00:00 0  [stack]\nSize: 4 kB\nVmFlags: rd wr mr mw me gd ac\n";
        let f = parse_smaps_flags(text);
        assert_eq!(f, vec![(0x7ffd1000, vec!["rd", "wr", "mr", "mw", "me", "gd", "ac"].into_iter().map(String::from).collect())]);
    }

    #[test]
    fn parses_stat_with_odd_comm() {
        let mut fields = vec!["S".to_string()];
        for i in 4..=52 {
            fields.push(i.to_string());
        }
        let text = format!("42 (a) b (c)) {}", fields.join(" "));
        let mm = parse_stat(&text).unwrap();
        assert_eq!(mm.start_code, 26);
        assert_eq!(mm.end_code, 27);
        assert_eq!(mm.start_stack, 28);
        assert_eq!(mm.start_brk, 47);
        assert_eq!(mm.env_end, 51);
        fields[0] = "Z".into();
        let st = parse_proc_stat(&format!("42 (a) b (c)) {}", fields.join(" "))).unwrap();
        assert_eq!(st, ProcStat { state: 'Z', pgrp: 5, session: 6, exit_code: 52, policy: 41 });
    }

    #[test]
    fn parses_status() {
        let text = "Name:\tpython3\nUmask:\t0022\nThreads:\t1\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\nGroups:\t\nNSpid:\t4242\t1\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\nRssAnon:\t    5432 kB\n";
        let st = parse_status(text).unwrap();
        assert_eq!(st.rss_anon_kb, 5432);
        assert_eq!(st.uid, [65534; 3]);
        assert_eq!(st.umask, 0o22);
        assert_eq!(st.nspid, vec![4242, 1]);
        assert_eq!(st.shared_pending, 0x100);
        assert!(st.groups.is_empty());
    }

    #[test]
    fn parses_epoll_and_eventfd_fdinfo() {
        let ep = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\ntfd:       13 events:       19 data:                d  pos:0 ino:40e sdev:10\ntfd:       11 events:       19 data:                b  pos:0 ino:13079 sdev:f\n";
        assert_eq!(parse_epoll_items(ep), vec![(13, 0x19, 0xd), (11, 0x19, 0xb)]);
        let ev = "pos:\t0\nflags:\t02004002\neventfd-count:                5\neventfd-id: 3\neventfd-semaphore: 1\n";
        assert_eq!(fdinfo_field(ev, "eventfd-count").as_deref(), Some("5"));
        assert_eq!(fdinfo_field(ev, "eventfd-semaphore").as_deref(), Some("1"));
        assert_eq!(fdinfo_field(ev, "nope"), None);
    }

    #[test]
    fn parses_fdinfo() {
        assert_eq!(parse_fdinfo("pos:\t12\nflags:\t02100002\nmnt_id:\t5\n"), (12, 0o2100002));
    }

    #[test]
    fn timers_parse() {
        let t = "ID: 5\nsignal: 10/0000000000000000\nnotify: signal/pid.8309\nClockID: 1\nID: 7\nsignal: 34/00007f00000000aa\nnotify: signal/tid.12\nClockID: 0\n";
        let got = parse_timers(t).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], TimerInfo { id: 5, signo: 10, sigval: 0, notify: libc::SIGEV_SIGNAL, target: 8309, clockid: 1 });
        assert_eq!((got[1].sigval, got[1].notify, got[1].target), (0x7f00000000aa, libc::SIGEV_THREAD_ID, 12));
        assert_eq!(parse_timers("").unwrap(), vec![]);
        assert!(parse_timers("ID: x\n").is_none());
    }
}
