//! Lambda layer versions as the registry keeps them (PublishLayerVersion and
//! friends, issue #16). A version's files are extracted once, under the node's
//! state directory (`dir`); a function's revision copies them into its own `opt/`,
//! so deleting a layer version never breaks a function that uses it (as in Lambda).

use std::path::PathBuf;

use rusqlite::{params, OptionalExtension, Row};

use super::{q, Registry, RegistryError};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS layer_versions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    description TEXT NOT NULL,
    runtimes_json TEXT NOT NULL,
    archs_json TEXT NOT NULL,
    license_info TEXT,
    code_sha256 TEXT NOT NULL,
    code_size INTEGER NOT NULL,
    unzipped_size INTEGER NOT NULL,
    created TEXT NOT NULL,
    dir TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS layer_counters (
    name TEXT PRIMARY KEY,
    last INTEGER NOT NULL
);
";

/// One published layer version.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerVersionRecord {
    pub name: String,
    /// Assigned by [`Registry::insert_layer_version`]: one more than the highest ever
    /// published under the name (a deleted number is never reused).
    pub version: u64,
    pub description: String,
    pub compatible_runtimes: Vec<String>,
    pub compatible_architectures: Vec<String>,
    pub license_info: Option<String>,
    /// Of the zip, base64 (Lambda's CodeSha256).
    pub code_sha256: String,
    /// Of the zip (Lambda's CodeSize).
    pub code_size: u64,
    /// Bytes of the extracted files (counted against a function's unzipped limit).
    pub unzipped_size: u64,
    pub created: String,
    /// Where the files are extracted.
    pub dir: PathBuf,
}

const COLS: &str =
    "name, version, description, runtimes_json, archs_json, license_info, code_sha256, code_size, unzipped_size, created, dir";

fn row(r: &Row<'_>) -> rusqlite::Result<LayerVersionRecord> {
    let list = |s: String| serde_json::from_str::<Vec<String>>(&s).unwrap_or_default();
    Ok(LayerVersionRecord {
        name: r.get(0)?,
        version: r.get(1)?,
        description: r.get(2)?,
        compatible_runtimes: list(r.get(3)?),
        compatible_architectures: list(r.get(4)?),
        license_info: r.get(5)?,
        code_sha256: r.get(6)?,
        code_size: r.get(7)?,
        unzipped_size: r.get(8)?,
        created: r.get(9)?,
        dir: PathBuf::from(r.get::<_, String>(10)?),
    })
}

impl Registry {
    /// Record a new version of `l.name` (its `version` field is ignored) and return
    /// the number it was given.
    pub fn insert_layer_version(&self, l: &LayerVersionRecord) -> Result<u64, RegistryError> {
        self.put_layer_version(l, None).map(|(v, _)| v)
    }

    /// Record `l` as version `l.version` of `l.name`, a number given elsewhere (a
    /// cluster's registry), replacing a record of that number; the counter moves past it
    /// so a version published here later never takes it. Returns the record replaced.
    pub fn install_layer_version(&self, l: &LayerVersionRecord) -> Result<Option<LayerVersionRecord>, RegistryError> {
        self.put_layer_version(l, Some(l.version)).map(|(_, old)| old)
    }

    /// Record `l` under `number`, or the next number when None; (number, record replaced).
    fn put_layer_version(&self, l: &LayerVersionRecord, number: Option<u64>) -> Result<(u64, Option<LayerVersionRecord>), RegistryError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(q("publish layer version"))?;
        let last: u64 = tx
            .query_row("SELECT last FROM layer_counters WHERE name=?1", [&l.name], |r| r.get(0))
            .optional()
            .map_err(q("publish layer version"))?
            .unwrap_or(0);
        let version = number.unwrap_or(last + 1);
        let old = tx
            .query_row(&format!("SELECT {COLS} FROM layer_versions WHERE name=?1 AND version=?2"), params![l.name, version], row)
            .optional()
            .map_err(q("publish layer version"))?;
        tx.execute(
            &format!("INSERT OR REPLACE INTO layer_versions ({COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)"),
            params![
                l.name,
                version,
                l.description,
                serde_json::to_string(&l.compatible_runtimes).expect("strings serialize"),
                serde_json::to_string(&l.compatible_architectures).expect("strings serialize"),
                l.license_info,
                l.code_sha256,
                l.code_size,
                l.unzipped_size,
                l.created,
                l.dir.to_string_lossy(),
            ],
        )
        .map_err(q("publish layer version"))?;
        tx.execute(
            "INSERT INTO layer_counters (name, last) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET last = max(last, excluded.last)",
            params![l.name, version.max(last)],
        )
        .map_err(q("publish layer version"))?;
        tx.commit().map_err(q("publish layer version"))?;
        Ok((version, old))
    }

    pub fn get_layer_version(&self, name: &str, version: u64) -> Result<Option<LayerVersionRecord>, RegistryError> {
        self.conn()
            .query_row(&format!("SELECT {COLS} FROM layer_versions WHERE name=?1 AND version=?2"), params![name, version], row)
            .optional()
            .map_err(q("get layer version"))
    }

    /// The versions of one layer, newest first (as ListLayerVersions answers).
    pub fn list_layer_versions(&self, name: &str) -> Result<Vec<LayerVersionRecord>, RegistryError> {
        let c = self.conn();
        let mut st = c
            .prepare(&format!("SELECT {COLS} FROM layer_versions WHERE name=?1 ORDER BY version DESC"))
            .map_err(q("list layer versions"))?;
        let rows = st.query_map([name], row).map_err(q("list layer versions"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(q("list layer versions"))
    }

    /// Every layer version, by name then newest first.
    pub fn all_layer_versions(&self) -> Result<Vec<LayerVersionRecord>, RegistryError> {
        let c = self.conn();
        let mut st =
            c.prepare(&format!("SELECT {COLS} FROM layer_versions ORDER BY name, version DESC")).map_err(q("list layers"))?;
        let rows = st.query_map([], row).map_err(q("list layers"))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(q("list layers"))
    }

    /// Forget a layer version; returns its record (None: there was none).
    pub fn delete_layer_version(&self, name: &str, version: u64) -> Result<Option<LayerVersionRecord>, RegistryError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(q("delete layer version"))?;
        let rec = tx
            .query_row(&format!("SELECT {COLS} FROM layer_versions WHERE name=?1 AND version=?2"), params![name, version], row)
            .optional()
            .map_err(q("delete layer version"))?;
        tx.execute("DELETE FROM layer_versions WHERE name=?1 AND version=?2", params![name, version])
            .map_err(q("delete layer version"))?;
        tx.commit().map_err(q("delete layer version"))?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str) -> LayerVersionRecord {
        LayerVersionRecord {
            name: name.into(),
            version: 0,
            description: "d".into(),
            compatible_runtimes: vec!["python3.12".into()],
            compatible_architectures: vec![],
            license_info: Some("MIT".into()),
            code_sha256: "sha".into(),
            code_size: 10,
            unzipped_size: 20,
            created: "t".into(),
            dir: "/state/layers/x".into(),
        }
    }

    #[test]
    fn versions_are_numbered_and_never_reused() {
        let r = Registry::open_in_memory().unwrap();
        assert_eq!(r.insert_layer_version(&rec("a")).unwrap(), 1);
        assert_eq!(r.insert_layer_version(&rec("a")).unwrap(), 2);
        assert_eq!(r.insert_layer_version(&rec("b")).unwrap(), 1);
        let got = r.get_layer_version("a", 2).unwrap().unwrap();
        assert_eq!((got.version, got.compatible_runtimes.clone(), got.license_info.clone()), (2, vec!["python3.12".into()], Some("MIT".into())));
        assert_eq!(r.list_layer_versions("a").unwrap().iter().map(|l| l.version).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(r.delete_layer_version("a", 2).unwrap().map(|l| l.version), Some(2));
        assert_eq!(r.delete_layer_version("a", 2).unwrap(), None);
        assert_eq!(r.insert_layer_version(&rec("a")).unwrap(), 3, "a deleted version's number is not reused");
        let all: Vec<(String, u64)> = r.all_layer_versions().unwrap().into_iter().map(|l| (l.name, l.version)).collect();
        assert_eq!(all, vec![("a".into(), 3), ("a".into(), 1), ("b".into(), 1)]);
    }

    #[test]
    fn an_installed_version_keeps_its_number_and_the_counter_moves_past_it() {
        let r = Registry::open_in_memory().unwrap();
        let mut l = rec("c");
        l.version = 7;
        assert_eq!(r.install_layer_version(&l).unwrap(), None);
        assert_eq!(r.get_layer_version("c", 7).unwrap().map(|g| g.version), Some(7));
        assert_eq!(r.insert_layer_version(&rec("c")).unwrap(), 8, "published here after it: the next number");
        l.code_sha256 = "other".into();
        let old = r.install_layer_version(&l).unwrap().expect("the record it replaced");
        assert_eq!(old.code_sha256, "sha");
        assert_eq!(r.get_layer_version("c", 7).unwrap().unwrap().code_sha256, "other");
        l.version = 3;
        r.install_layer_version(&l).unwrap();
        assert_eq!(r.insert_layer_version(&rec("c")).unwrap(), 9, "an older number installed does not move the counter back");
    }
}
