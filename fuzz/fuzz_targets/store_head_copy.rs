//! A head's copy as a miss reads it (`thaw_store::fetch::HeadCopy`): the bytes of a
//! store object, untrusted until checked, arriving in parts. The first input byte
//! sets the parts' size (its top bit: once the manifest is here the miss says it checks
//! chunk by chunk, `HeadCopy::unhashed`, else by the pack's hash, `HeadCopy::hashed`),
//! the second the limit the miss sets
//! once the manifest gave the head's size (0: none); the rest is the object. Checked against a model of the
//! format (`fetch::HEAD_MAGIC`, the manifest's length, the manifest, the pack): the
//! manifest handed over, the pack's bytes, their hash, and every prefix.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sha2::Digest;
use thaw_store::bytes::Bytes;
use thaw_store::fetch::{HeadCopy, HEAD_MAGIC};

fuzz_target!(|data: &[u8]| {
    let [step, limit, copy @ ..] = data else { return };
    let unhashed = *step & 0x80 != 0;
    let step = usize::from(*step & 0x7f).max(1);
    let limit = (*limit > 0).then(|| usize::from(*limit) * 4);
    // The model: where the pack starts, and the manifest (None: no copy at all).
    let header = HEAD_MAGIC.len() + 4;
    let (manifest, pack_at): (Option<&[u8]>, Option<usize>) = if copy.len() >= header && copy.starts_with(HEAD_MAGIC) {
        let n = u32::from_le_bytes(copy[HEAD_MAGIC.len()..header].try_into().unwrap()) as usize;
        match n <= thaw_store::manifest::MAX_MANIFEST_LEN && header + n <= copy.len() {
            true => ((n > 0).then(|| &copy[header..header + n]), Some(header + n)),
            false => (None, None),
        }
    } else {
        (None, Some(0))
    };
    let pack = pack_at.map(|p| &copy[p..]).filter(|pack| limit.is_none_or(|l| pack.len() <= l));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let parts: Vec<thaw_store::Result<Bytes>> = copy.chunks(step).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    rt.block_on(async {
        let head = HeadCopy::from_parts("s3://fuzz/heads/x".into(), async move { Ok(futures::stream::iter(parts)) });
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
        // pack later turns out too long; none from a copy without one.
        assert_eq!(got.as_deref(), manifest.filter(|_| pack_at.is_some()), "the manifest");
        match (head.get_hashed().await, pack) {
            (Some((bytes, digest)), Some(pack)) => {
                assert_eq!(&bytes[..], pack, "the pack's bytes");
                // Never hashed when told so; asked to after the copy ended, no digest
                // (the reader hashes it); never a wrong one.
                let want = hex::encode(sha2::Sha256::digest(pack));
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
