//! The SigV4 verifier. Input format (so real signed requests are valid seeds):
//! line 1 method, line 2 path, line 3 query ("-" for none), then "Name: value"
//! header lines, an empty line, the body. The clock is the corpus's signing time.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, UNIX_EPOCH};
use thaw_node::sigv4::{Credentials, SignedRequest, Verifier};

fuzz_target!(|data: &[u8]| {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &b""[..]),
    };
    let Ok(head) = std::str::from_utf8(head) else { return };
    let mut lines = head.split('\n');
    let method = lines.next().unwrap_or("");
    let raw_path = lines.next().unwrap_or("");
    let raw_query = lines.next().filter(|q| *q != "-");
    let headers = lines.filter_map(|l| l.split_once(": ")).collect();
    let req = SignedRequest { method, raw_path, raw_query, headers, body };
    let v = Verifier::new(
        "lambda",
        vec![Credentials { access_key_id: "AKIDTHAWTEST".into(), secret_access_key: "thaw/secret+key/EXAMPLE".into() }],
    );
    // 2024-05-01T12:00:00Z, when the seeds were signed.
    let _ = v.verify(&req, UNIX_EPOCH + Duration::from_secs(1_714_564_800));
});
