//! The Lambda API's request parsing: routing (method + raw path), FunctionName
//! resolution and CreateFunction validation (JSON body, base64 zip). Input: line 1
//! method, line 2 raw path, line 3 qualifier ("-" for none), the rest the body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use thaw_node::api;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let method = parts.next().unwrap_or(b"");
    let path = String::from_utf8_lossy(parts.next().unwrap_or(b""));
    let qualifier = parts.next().map(String::from_utf8_lossy).filter(|q| q != "-");
    let body = parts.next().unwrap_or(b"");
    if let Ok(m) = http::Method::from_bytes(method) {
        let _ = api::route(&m, &path);
    }
    if let Ok((name, _)) = api::function_name(&path, qualifier.as_deref()) {
        assert!(!name.is_empty() && name.len() <= 64, "{name:?}");
    }
    let _ = api::create_spec(body);
});
