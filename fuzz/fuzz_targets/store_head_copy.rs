//! A head's copy as a miss reads it (`thaw_store::fetch::HeadCopy`): the bytes of a
//! store object, untrusted until checked, arriving in parts. The first input byte
//! sets the parts' size (its top bit: once the manifest is here the miss says it checks
//! chunk by chunk, `HeadCopy::unhashed`, else by the pack's hash, `HeadCopy::hashed`),
//! the second the limit the miss sets
//! once the manifest gave the head's size (0: none); the rest is the object. A copy
//! that starts with `HEAD_SPLIT_MAGIC` or `HEAD_BASE_MAGIC` (a diff's, carrying its
//! base's start after the manifest) is split: the input's last byte `r` says what
//! the second object is (0: not requested; 1: missing; else the `r - 2` bytes before
//! it, the rest of the input being the first object). Any other copy is read beside a
//! stale second part, which it must leave unread. Checked against a model of the
//! format (`fetch::HEAD_MAGIC`, the manifest's length, the manifest, the pack): the
//! manifest handed over, the base's start, the pack's bytes, their hash, and every prefix.
#![no_main]
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use sha2::Digest;
use thaw_store::bytes::Bytes;
use thaw_store::fetch::{HeadCopy, PartsRead, HEAD_BASE_MAGIC, HEAD_MAGIC, HEAD_SPLIT_MAGIC, MAX_CARRIED_BASE};

/// What the second object is.
enum Second<'a> {
    NotAsked,
    Missing,
    Bytes(&'a [u8]),
}

fuzz_target!(|data: &[u8]| {
    let [step, limit, copy @ ..] = data else { return };
    let unhashed = *step & 0x80 != 0;
    let step = usize::from(*step & 0x7f).max(1);
    let limit = (*limit > 0).then(|| usize::from(*limit) * 4);
    let split = copy.starts_with(HEAD_SPLIT_MAGIC) || copy.starts_with(HEAD_BASE_MAGIC);
    let (first, second) = match (split, copy.split_last()) {
        (true, Some((&0, first))) => (first, Second::NotAsked),
        (true, Some((&1, first))) => (first, Second::Missing),
        (true, Some((&r, rest))) => {
            let cut = rest.len().saturating_sub(usize::from(r) - 2);
            (&rest[..cut], Second::Bytes(&rest[cut..]))
        }
        _ => (copy, Second::Bytes(b"a stale second part")),
    };
    // The model: the manifest handed over, the base's start a diff's copy carries, and
    // where the pack starts (None: no copy at all).
    let header = HEAD_MAGIC.len() + 4;
    let magic = (first.len() >= header).then(|| &first[..HEAD_MAGIC.len()]);
    let carries = magic == Some(&HEAD_BASE_MAGIC[..]);
    let known = magic.is_some_and(|m| m == HEAD_MAGIC || m == HEAD_SPLIT_MAGIC || m == HEAD_BASE_MAGIC);
    let u32_at = |at: usize| u32::from_le_bytes(first[at..at + 4].try_into().unwrap()) as usize;
    let (manifest, base, pack_at): (Option<&[u8]>, Option<&[u8]>, Option<usize>) = if known {
        let n = u32_at(HEAD_MAGIC.len());
        let end = header + n;
        let some = |n: usize, r: std::ops::Range<usize>| (n > 0).then(|| &first[r]);
        match (n <= thaw_store::manifest::MAX_MANIFEST_LEN, carries) {
            (false, _) => (None, None, None),
            (true, false) if end <= first.len() => (some(n, header..end), None, Some(end)),
            (true, false) => (None, None, None),
            // A diff's copy: the manifest is handed over once the base's length is here
            // too, the base's start once all of it is.
            (true, true) if end + 4 > first.len() => (None, None, None),
            (true, true) => match u32_at(end) {
                b if b > MAX_CARRIED_BASE => (None, None, None),
                b if end + 4 + b <= first.len() => (some(n, header..end), Some(&first[end + 4..end + 4 + b]), Some(end + 4 + b)),
                _ => (some(n, header..end), None, None),
            },
        }
    } else {
        (None, None, Some(0))
    };
    // A split copy's pack goes on in its second object; it is none without it. (Split
    // as its first object's header tells: one shorter than a header is not.)
    let split = first.len() >= header && (first.starts_with(HEAD_SPLIT_MAGIC) || carries);
    let pack: Option<Vec<u8>> = pack_at
        .and_then(|p| match (split, &second) {
            (false, _) => Some(first[p..].to_vec()),
            (true, Second::Bytes(rest)) => Some([&first[p..], rest].concat()),
            (true, _) => None,
        })
        .filter(|pack| limit.is_none_or(|l| pack.len() <= l));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let read = |bytes: &[u8]| -> PartsRead {
        let parts: Vec<thaw_store::Result<Bytes>> = bytes.chunks(step).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        Box::pin(async move { Ok(futures::stream::iter(parts).boxed()) })
    };
    let rest: Option<PartsRead> = match second {
        Second::NotAsked => None,
        Second::Missing => Some(Box::pin(async { Err(thaw_store::StoreError::NotFound { object: "s3://fuzz/heads/x.rest".into() }) })),
        Second::Bytes(b) => Some(read(b)),
    };
    let first = read(first);
    rt.block_on(async {
        let head = HeadCopy::from_split("s3://fuzz/heads/x".into(), first, rest);
        if let Some(l) = limit {
            head.limit(l as u64);
        }
        let got = head.manifest().await;
        if unhashed {
            head.unhashed();
        } else {
            head.hashed();
        }
        // A manifest is handed over as soon as it is here, even from a copy whose
        // pack later turns out too long or incomplete; none from a copy without one.
        assert_eq!(got.as_deref(), manifest, "the manifest");
        assert_eq!(head.base().await.as_deref(), base, "the base's start");
        match (head.get_hashed().await, pack) {
            (Some((bytes, digest)), Some(pack)) => {
                assert_eq!(&bytes[..], &pack[..], "the pack's bytes");
                // Never hashed when told so; asked to after the copy ended, no digest
                // (the reader hashes it); never a wrong one.
                let want = hex::encode(sha2::Sha256::digest(&pack));
                assert!(if unhashed { digest.is_empty() } else { digest == want || digest.is_empty() }, "their hash, not the manifest's: {digest}");
                for n in [0, 1.min(pack.len()), pack.len() / 2, pack.len()] {
                    assert_eq!(head.prefix(n).await.as_deref(), Some(&pack[..n]));
                }
                assert!(head.prefix(pack.len() + 1).await.is_none());
            }
            (None, None) => {}
            (got, want) => panic!("copy {:?} where the model has {:?}", got.map(|g| g.0.len()), want.map(|w| w.len())),
        }
    });
});
