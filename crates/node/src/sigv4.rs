//! AWS Signature Version 4 verification (header-based `Authorization`).
//!
//! The node recomputes the signature the client must have made: canonical
//! request (method, canonical URI, canonical query, signed headers, payload
//! hash) → string to sign → HMAC chain over date/region/service. Any region is
//! accepted; the service must be the verifier's (`lambda`). Timestamps more
//! than [`MAX_SKEW`] away from the node's clock are rejected.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, NaiveDateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

/// Largest accepted difference between the request's `X-Amz-Date` and the node's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// `x-amz-content-sha256` value meaning "body not signed".
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// An access key pair the node accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// Why a request was not authenticated. Each maps to one of Lambda's 403 error types.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SigV4Error {
    #[error("Missing Authentication Token")]
    Missing,
    #[error("Authorization header requires {0}")]
    Incomplete(String),
    #[error("The security token included in the request is invalid.")]
    UnknownKey(String),
    #[error("Credential should be scoped to correct service: '{expected}'. ")]
    WrongService { expected: String, got: String },
    #[error("Signature expired: {request} is now earlier than {earliest} ({now} - 15 min.)")]
    Expired { request: String, earliest: String, now: String },
    #[error("Signature not yet current: {request} is still later than {latest} ({now} + 15 min.)")]
    NotYetCurrent { request: String, latest: String, now: String },
    #[error("The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.")]
    Mismatch,
    #[error("The provided x-amz-content-sha256 header does not match what was computed.")]
    PayloadHashMismatch,
    #[error("x-amz-content-sha256: UNSIGNED-PAYLOAD is not accepted; sign the request body.")]
    UnsignedPayload,
}

impl SigV4Error {
    /// Lambda's `x-amzn-ErrorType` for this failure.
    pub fn error_type(&self) -> &'static str {
        match self {
            SigV4Error::Missing => "MissingAuthenticationTokenException",
            SigV4Error::Incomplete(_) => "IncompleteSignatureException",
            SigV4Error::UnknownKey(_) => "UnrecognizedClientException",
            _ => "InvalidSignatureException",
        }
    }
}

/// The parts of an HTTP request that take part in the signature.
pub struct SignedRequest<'a> {
    pub method: &'a str,
    /// The path exactly as sent (still percent-encoded).
    pub raw_path: &'a str,
    /// The query string exactly as sent, without `?`.
    pub raw_query: Option<&'a str>,
    /// Header (name, value) pairs; names in any case, repeated names allowed.
    pub headers: Vec<(&'a str, &'a str)>,
    pub body: &'a [u8],
}

impl SignedRequest<'_> {
    /// All values of a header joined with ',' (as SigV4 canonicalises them).
    fn header(&self, name: &str) -> Option<String> {
        let vals: Vec<String> =
            self.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| canonical_value(v)).collect();
        if vals.is_empty() {
            None
        } else {
            Some(vals.join(","))
        }
    }
}

/// Verifies signatures for one service against a set of keys.
pub struct Verifier {
    service: String,
    keys: Vec<Credentials>,
}

/// The parts of a request's Authorization header.
struct AuthHeader {
    access_key: String,
    date: String,
    region: String,
    service: String,
    signed_headers: Vec<String>,
    signature: String,
}

fn parse_auth(value: &str) -> Result<AuthHeader, SigV4Error> {
    let rest = value
        .strip_prefix(ALGORITHM)
        .ok_or_else(|| SigV4Error::Incomplete(format!("the {ALGORITHM} algorithm")))?;
    let (mut cred, mut signed, mut sig) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            cred = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            sig = Some(v);
        }
    }
    let cred = cred.ok_or_else(|| SigV4Error::Incomplete("'Credential' parameter".into()))?;
    let signed = signed.ok_or_else(|| SigV4Error::Incomplete("'SignedHeaders' parameter".into()))?;
    let signature = sig.ok_or_else(|| SigV4Error::Incomplete("'Signature' parameter".into()))?;
    let parts: Vec<&str> = cred.split('/').collect();
    if parts.len() != 5 || parts[4] != "aws4_request" {
        return Err(SigV4Error::Incomplete("a Credential of the form KEY/DATE/REGION/SERVICE/aws4_request".into()));
    }
    Ok(AuthHeader {
        access_key: parts[0].to_string(),
        date: parts[1].to_string(),
        region: parts[2].to_string(),
        service: parts[3].to_string(),
        signed_headers: signed.split(';').map(str::to_string).collect(),
        signature: signature.to_string(),
    })
}

fn fmt_amz(t: DateTime<Utc>) -> String {
    t.format("%Y%m%dT%H%M%SZ").to_string()
}

impl Verifier {
    pub fn new(service: &str, keys: Vec<Credentials>) -> Verifier {
        Verifier { service: service.to_string(), keys }
    }

    /// Everything that can be checked before the body is read: the Authorization
    /// header's form, a known access key, the service, the date within [`MAX_SKEW`],
    /// a signed host header, and a payload hash that is not `UNSIGNED-PAYLOAD`.
    /// A request failing here is answered without reading its body.
    pub fn check_headers(&self, req: &SignedRequest<'_>, now: SystemTime) -> Result<(), SigV4Error> {
        self.authenticate_headers(req, now).map(|_| ())
    }

    /// Whether the signature covers a payload hash sent in `x-amz-content-sha256`,
    /// so that [`Verifier::verify`] can be run on the headers alone (the body is then
    /// checked against that hash).
    pub fn hash_in_headers(req: &SignedRequest<'_>) -> bool {
        req.header("x-amz-content-sha256").is_some_and(|v| v != UNSIGNED_PAYLOAD)
    }

    /// The checked Authorization header, the request's X-Amz-Date and the key.
    fn authenticate_headers(&self, req: &SignedRequest<'_>, now: SystemTime) -> Result<(AuthHeader, String, &Credentials), SigV4Error> {
        let auth_value = req.header("authorization").ok_or(SigV4Error::Missing)?;
        let auth = parse_auth(&auth_value)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.access_key_id == auth.access_key)
            .ok_or_else(|| SigV4Error::UnknownKey(auth.access_key.clone()))?;
        if auth.service != self.service {
            return Err(SigV4Error::WrongService { expected: self.service.clone(), got: auth.service.clone() });
        }
        let amz_date = req.header("x-amz-date").ok_or_else(|| SigV4Error::Incomplete("an X-Amz-Date header".into()))?;
        let t = NaiveDateTime::parse_from_str(&amz_date, "%Y%m%dT%H%M%SZ")
            .map_err(|_| SigV4Error::Incomplete("an X-Amz-Date in the form YYYYMMDDTHHMMSSZ".into()))?
            .and_utc();
        if !amz_date.starts_with(&auth.date) {
            return Err(SigV4Error::Mismatch);
        }
        let now: DateTime<Utc> = now.into();
        let skew = chrono::Duration::from_std(MAX_SKEW).expect("15 minutes fits");
        if t < now - skew {
            return Err(SigV4Error::Expired { request: amz_date, earliest: fmt_amz(now - skew), now: fmt_amz(now) });
        }
        if t > now + skew {
            return Err(SigV4Error::NotYetCurrent { request: amz_date, latest: fmt_amz(now + skew), now: fmt_amz(now) });
        }
        if !auth.signed_headers.iter().any(|h| h == "host") {
            return Err(SigV4Error::Incomplete("the host header to be signed".into()));
        }
        if req.header("x-amz-content-sha256").is_some_and(|v| v == UNSIGNED_PAYLOAD) {
            return Err(SigV4Error::UnsignedPayload);
        }
        Ok((auth, amz_date, key))
    }

    /// Check `req`'s signature at time `now`; returns the access key id on success.
    /// With `body_checked_later`, the payload hash is taken from `x-amz-content-sha256`
    /// (see [`Verifier::hash_in_headers`]) and the caller must compare the body with
    /// it ([`Verifier::check_body`]); otherwise the hash is computed from `req.body`.
    pub fn verify(&self, req: &SignedRequest<'_>, now: SystemTime) -> Result<String, SigV4Error> {
        self.verify_inner(req, now, false)
    }

    /// [`Verifier::verify`] before the body is read: only for requests whose
    /// signed headers carry the payload hash ([`Verifier::hash_in_headers`]).
    pub fn verify_headers_only(&self, req: &SignedRequest<'_>, now: SystemTime) -> Result<String, SigV4Error> {
        self.verify_inner(req, now, true)
    }

    /// The body of a request verified with [`Verifier::verify_headers_only`] must
    /// hash to the signed `x-amz-content-sha256`.
    pub fn check_body(req: &SignedRequest<'_>) -> Result<(), SigV4Error> {
        match req.header("x-amz-content-sha256") {
            Some(v) if v == hex::encode(Sha256::digest(req.body)) => Ok(()),
            _ => Err(SigV4Error::PayloadHashMismatch),
        }
    }

    fn verify_inner(&self, req: &SignedRequest<'_>, now: SystemTime, body_checked_later: bool) -> Result<String, SigV4Error> {
        let (auth, amz_date, key) = self.authenticate_headers(req, now)?;
        let payload_hash = match req.header("x-amz-content-sha256") {
            Some(v) if body_checked_later => v,
            Some(v) => {
                if v != hex::encode(Sha256::digest(req.body)) {
                    return Err(SigV4Error::PayloadHashMismatch);
                }
                v
            }
            None if body_checked_later => return Err(SigV4Error::Incomplete("an x-amz-content-sha256 header".into())),
            None => hex::encode(Sha256::digest(req.body)),
        };
        let signed: Vec<&str> = auth.signed_headers.iter().map(String::as_str).collect();
        let canonical = canonical_request(req, &signed, &payload_hash)?;
        let scope = format!("{}/{}/{}/aws4_request", auth.date, auth.region, auth.service);
        let string_to_sign =
            format!("{ALGORITHM}\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
        let provided = hex::decode(&auth.signature).map_err(|_| SigV4Error::Mismatch)?;
        let signing_key = signing_key(&key.secret_access_key, &auth.date, &auth.region, &auth.service);
        let mut mac = HmacSha256::new_from_slice(&signing_key).expect("HMAC takes any key length");
        mac.update(string_to_sign.as_bytes());
        mac.verify_slice(&provided).map_err(|_| SigV4Error::Mismatch)?;
        Ok(key.access_key_id.clone())
    }
}

/// Signs `req` (the client side of [`Verifier::verify`]): returns the headers to add to
/// it, `x-amz-date`, `x-amz-content-sha256` and `authorization`, signing every header
/// `req` carries (it must carry `host`).
pub fn sign(key: &Credentials, region: &str, service: &str, req: &SignedRequest<'_>, now: SystemTime) -> Vec<(&'static str, String)> {
    let amz_date = fmt_amz(now.into());
    let date = &amz_date[..8];
    let payload_hash = hex::encode(Sha256::digest(req.body));
    let mut headers = req.headers.clone();
    headers.push(("x-amz-date", &amz_date));
    headers.push(("x-amz-content-sha256", &payload_hash));
    let mut names: Vec<String> = headers.iter().map(|(k, _)| k.to_ascii_lowercase()).collect();
    names.sort();
    names.dedup();
    let signed: Vec<&str> = names.iter().map(String::as_str).collect();
    let full = SignedRequest { method: req.method, raw_path: req.raw_path, raw_query: req.raw_query, headers, body: req.body };
    let canonical = canonical_request(&full, &signed, &payload_hash).expect("every signed header is present");
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!("{ALGORITHM}\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let signature = hex::encode(hmac(&signing_key(&key.secret_access_key, date, region, service), string_to_sign.as_bytes()));
    let auth = format!("{ALGORITHM} Credential={}/{scope}, SignedHeaders={}, Signature={signature}", key.access_key_id, signed.join(";"));
    vec![("x-amz-date", amz_date.clone()), ("x-amz-content-sha256", payload_hash.clone()), ("authorization", auth)]
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// kSigning = HMAC(HMAC(HMAC(HMAC("AWS4"+secret, date), region), service), "aws4_request").
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// Trim and collapse runs of spaces, as SigV4 canonical header values require.
fn canonical_value(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Percent-encode everything but RFC 3986 unreserved characters (and '/' if `keep_slash`).
fn aws_encode(input: &[u8], keep_slash: bool) -> String {
    let mut out = String::with_capacity(input.len());
    for &b in input {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Remove `.` and `..` segments (RFC 3986 5.2.4), keeping a trailing slash.
fn normalize_path(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').collect();
    for (i, seg) in segs.iter().enumerate() {
        match *seg {
            "." => {}
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
            }
            s => out.push(s),
        }
        if i == segs.len() - 1 && (*seg == "." || *seg == "..") {
            out.push("");
        }
    }
    let joined = out.join("/");
    if joined.starts_with('/') {
        joined
    } else {
        format!("/{joined}")
    }
}

fn canonical_query(raw: Option<&str>) -> String {
    let Some(raw) = raw else { return String::new() };
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
            (aws_encode(&dec(k), false), aws_encode(&dec(v), false))
        })
        .collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

fn canonical_request(req: &SignedRequest<'_>, signed: &[&str], payload_hash: &str) -> Result<String, SigV4Error> {
    // botocore (like every SDK except for S3) encodes the already-encoded path once more.
    let uri = aws_encode(normalize_path(req.raw_path).as_bytes(), true);
    let mut headers = String::new();
    for name in signed {
        let v = req.header(name).ok_or(SigV4Error::Mismatch)?;
        headers.push_str(name);
        headers.push(':');
        headers.push_str(&v);
        headers.push('\n');
    }
    Ok(format!(
        "{}\n{uri}\n{}\n{headers}\n{}\n{payload_hash}",
        req.method.to_ascii_uppercase(),
        canonical_query(req.raw_query),
        signed.join(";")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        NaiveDateTime::parse_from_str(s, "%Y%m%dT%H%M%SZ").unwrap().and_utc().into()
    }

    /// Signed by botocore 1.35 (`SigV4Auth(creds, 'lambda', 'us-east-1')`) at 2024-05-01 12:00:00Z.
    fn botocore_request(sig: &str) -> (Vec<(&'static str, String)>, &'static [u8]) {
        (
            vec![
                ("Host", "127.0.0.1:9000".to_string()),
                ("X-Amz-Invocation-Type", "RequestResponse".to_string()),
                ("Content-Type", "application/json".to_string()),
                ("X-Amz-Date", "20240501T120000Z".to_string()),
                ("Authorization", format!("AWS4-HMAC-SHA256 Credential=AKIDTHAWTEST/20240501/us-east-1/lambda/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-invocation-type, Signature={sig}")),
            ],
            br#"{"name": "thaw"}"#,
        )
    }
    #[test]
    fn sign_round_trips_through_verify() {
        let key = Credentials { access_key_id: "AKIDTHAWTEST".into(), secret_access_key: "s3cr3t".into() };
        let req = SignedRequest {
            method: "POST",
            raw_path: "/2015-03-31/functions/f%3A%24LATEST/invocations",
            raw_query: Some("Qualifier=%24LATEST"),
            headers: vec![("Host", "gw:9000"), ("X-Amz-Invocation-Type", "RequestResponse")],
            body: b"{}",
        };
        let now = at("20240501T120000Z");
        let added = sign(&key, "us-east-1", "lambda", &req, now);
        let mut headers = req.headers.clone();
        headers.extend(added.iter().map(|(k, v)| (*k, v.as_str())));
        let signed = SignedRequest { headers, ..req };
        let v = Verifier::new("lambda", vec![key.clone()]);
        assert_eq!(v.verify(&signed, now).unwrap(), "AKIDTHAWTEST");
        let tampered = SignedRequest { body: b"{ }", ..signed };
        assert_eq!(v.verify(&tampered, now), Err(SigV4Error::PayloadHashMismatch));
    }

    const BOTO_SIG: &str = "321aa490f85c5eda41c48eef9bca8b12559a53967a97836674faddbc1c6b98aa";

    fn verifier(secret: &str) -> Verifier {
        Verifier::new("lambda", vec![Credentials { access_key_id: "AKIDTHAWTEST".into(), secret_access_key: secret.into() }])
    }

    fn check(v: &Verifier, headers: &[(&'static str, String)], body: &[u8], now: &str) -> Result<String, SigV4Error> {
        let req = SignedRequest {
            method: "POST",
            raw_path: "/2015-03-31/functions/my-fn%3A%24LATEST/invocations",
            raw_query: Some("Qualifier=%24LATEST&b=x%20y"),
            headers: headers.iter().map(|(k, v)| (*k, v.as_str())).collect(),
            body,
        };
        v.verify(&req, at(now))
    }

    #[test]
    fn botocore_vector_verifies() {
        let (h, body) = botocore_request(BOTO_SIG);
        assert_eq!(check(&verifier("thaw/secret+key/EXAMPLE"), &h, body, "20240501T120500Z"), Ok("AKIDTHAWTEST".into()));
    }

    #[test]
    fn wrong_secret_body_or_query_is_rejected() {
        let (h, body) = botocore_request(BOTO_SIG);
        assert_eq!(check(&verifier("other"), &h, body, "20240501T120000Z"), Err(SigV4Error::Mismatch));
        assert_eq!(check(&verifier("thaw/secret+key/EXAMPLE"), &h, b"{}", "20240501T120000Z"), Err(SigV4Error::Mismatch));
        let (h, body) = botocore_request(&BOTO_SIG.replace('3', "4"));
        assert_eq!(check(&verifier("thaw/secret+key/EXAMPLE"), &h, body, "20240501T120000Z"), Err(SigV4Error::Mismatch));
    }

    #[test]
    fn skew_and_unknown_key_and_missing_header() {
        let v = verifier("thaw/secret+key/EXAMPLE");
        let (h, body) = botocore_request(BOTO_SIG);
        let e = check(&v, &h, body, "20240501T121501Z").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Signature expired: 20240501T120000Z is now earlier than 20240501T120001Z (20240501T121501Z - 15 min.)"
        );
        assert!(matches!(check(&v, &h, body, "20240501T114459Z"), Err(SigV4Error::NotYetCurrent { .. })));
        let other = Verifier::new("lambda", vec![Credentials { access_key_id: "X".into(), secret_access_key: "y".into() }]);
        assert_eq!(check(&other, &h, body, "20240501T120000Z"), Err(SigV4Error::UnknownKey("AKIDTHAWTEST".into())));
        assert_eq!(check(&v, &h[..4], body, "20240501T120000Z"), Err(SigV4Error::Missing));
        assert_eq!(SigV4Error::Missing.error_type(), "MissingAuthenticationTokenException");
        assert_eq!(SigV4Error::Mismatch.error_type(), "InvalidSignatureException");
    }

    #[test]
    fn payload_hash_header() {
        let v = verifier("thaw/secret+key/EXAMPLE");
        let (mut h, body) = botocore_request(BOTO_SIG);
        h.push(("X-Amz-Content-Sha256", "00".repeat(32)));
        assert_eq!(check(&v, &h, body, "20240501T120000Z"), Err(SigV4Error::PayloadHashMismatch));
    }

    #[test]
    fn unsigned_payload_is_refused_before_the_body() {
        let v = verifier("thaw/secret+key/EXAMPLE");
        let (mut h, body) = botocore_request(BOTO_SIG);
        h.push(("X-Amz-Content-Sha256", UNSIGNED_PAYLOAD.to_string()));
        assert_eq!(check(&v, &h, body, "20240501T120000Z"), Err(SigV4Error::UnsignedPayload));
        let req = SignedRequest { method: "POST", raw_path: "/", raw_query: None, headers: h.iter().map(|(k, v)| (*k, v.as_str())).collect(), body: b"" };
        assert_eq!(v.check_headers(&req, at("20240501T120000Z")), Err(SigV4Error::UnsignedPayload));
        // Without a body, an unknown key or a stale date is already refused.
        let other = Verifier::new("lambda", vec![Credentials { access_key_id: "X".into(), secret_access_key: "y".into() }]);
        let (h, _) = botocore_request(BOTO_SIG);
        let req = SignedRequest { method: "POST", raw_path: "/", raw_query: None, headers: h.iter().map(|(k, v)| (*k, v.as_str())).collect(), body: b"" };
        assert_eq!(other.check_headers(&req, at("20240501T120000Z")), Err(SigV4Error::UnknownKey("AKIDTHAWTEST".into())));
        assert!(matches!(v.check_headers(&req, at("20240502T120000Z")), Err(SigV4Error::Expired { .. })));
        assert_eq!(v.check_headers(&req, at("20240501T120000Z")), Ok(()));
    }

    /// A request whose signed headers carry the body's hash is verified before its
    /// body is read, and the body is then held to that hash.
    #[test]
    fn signed_payload_hash_verifies_before_the_body() {
        let secret = "thaw/secret+key/EXAMPLE";
        let v = verifier(secret);
        let body = br#"{"k": 1}"#;
        let hash = hex::encode(Sha256::digest(body));
        let mut headers = vec![("Host", "127.0.0.1:9000".to_string()), ("X-Amz-Date", "20240501T120000Z".to_string()), ("X-Amz-Content-Sha256", hash.clone())];
        let signed = ["host", "x-amz-content-sha256", "x-amz-date"];
        fn req<'a>(headers: &'a [(&'static str, String)], body: &'a [u8]) -> SignedRequest<'a> {
            SignedRequest {
                method: "POST",
                raw_path: "/2015-03-31/functions/f/invocations",
                raw_query: None,
                headers: headers.iter().map(|(k, v)| (*k, v.as_str())).collect(),
                body,
            }
        }
        let canonical = canonical_request(&req(&headers, b""), &signed, &hash).unwrap();
        let sts = format!("{ALGORITHM}\n20240501T120000Z\n20240501/us-east-1/lambda/aws4_request\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
        let sig = hex::encode(hmac(&signing_key(secret, "20240501", "us-east-1", "lambda"), sts.as_bytes()));
        headers.push(("Authorization", format!("AWS4-HMAC-SHA256 Credential=AKIDTHAWTEST/20240501/us-east-1/lambda/aws4_request, SignedHeaders={}, Signature={sig}", signed.join(";"))));
        let now = at("20240501T120000Z");
        assert!(Verifier::hash_in_headers(&req(&headers, b"")));
        assert_eq!(v.verify_headers_only(&req(&headers, b""), now), Ok("AKIDTHAWTEST".into()));
        assert_eq!(Verifier::check_body(&req(&headers, body)), Ok(()));
        assert_eq!(Verifier::check_body(&req(&headers, b"{}")), Err(SigV4Error::PayloadHashMismatch));
        assert_eq!(v.verify(&req(&headers, body), now), Ok("AKIDTHAWTEST".into()));
    }

    /// AWS's published test suite vector `get-vanilla` (service "service").
    #[test]
    fn aws_suite_get_vanilla() {
        let v = Verifier::new(
            "service",
            vec![Credentials {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            }],
        );
        let auth = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        let req = SignedRequest {
            method: "GET",
            raw_path: "/",
            raw_query: None,
            headers: vec![("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z"), ("Authorization", auth)],
            body: b"",
        };
        assert_eq!(v.verify(&req, at("20150830T123600Z")), Ok("AKIDEXAMPLE".into()));
    }

    #[test]
    fn canonical_pieces() {
        assert_eq!(canonical_query(Some("b=2&a=x%20y&a=1")), "a=1&a=x%20y&b=2");
        assert_eq!(normalize_path("/a/./b/../c"), "/a/c");
        assert_eq!(aws_encode(b"/f/my%3A", true), "/f/my%253A");
    }
}
