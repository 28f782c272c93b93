//! Triton's cloud credential file: `TRITON_CLOUD_CREDENTIAL_PATH` names a JSON file holding
//! credentials per cloud and per URL prefix, and a repository uses the entry whose key is the
//! longest prefix of its URL (`""` matches every URL of that cloud):
//!
//! ```json
//! { "s3": { "": { "key_id": "...", "secret_key": "...", "region": "...", "session_token": "" },
//!           "s3://bucket-2": { ... } },
//!   "gs": { "": "/path/to/service-account.json" },
//!   "as": { "as://account/container": { "account_str": "account", "account_key": "..." } } }
//! ```
//!
//! An entry wins over the cloud's environment variables, as in Triton; a URL no entry matches
//! uses the environment. Empty strings are absent values.

use super::clients::Cloud;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The environment variable naming the file.
pub const CREDENTIAL_PATH_ENV: &str = "TRITON_CLOUD_CREDENTIAL_PATH";

/// Largest credential file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// An S3 entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct S3Credential {
    pub key_id: String,
    pub secret_key: String,
    pub region: String,
    pub session_token: String,
    /// An AWS profile: object_store reads none, so an entry naming one is refused.
    pub profile: String,
}

/// An Azure entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AzureCredential {
    /// The account; the URL names it too, and the two must agree.
    pub account_str: String,
    pub account_key: String,
}

/// The entry a repository uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    S3(S3Credential),
    /// The path of a service-account (or authorized-user) JSON file.
    Gcs(String),
    Azure(AzureCredential),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct File {
    s3: BTreeMap<String, S3Credential>,
    gs: BTreeMap<String, String>,
    #[serde(rename = "as")]
    azure: BTreeMap<String, AzureCredential>,
}

/// The entry of the file named by `TRITON_CLOUD_CREDENTIAL_PATH` for `location`, if the variable
/// is set and an entry matches.
///
/// # Errors
/// The file cannot be read or is not the format above.
pub fn for_location(cloud: Cloud, location: &str) -> Result<Option<Credential>, String> {
    let Some(path) = std::env::var_os(CREDENTIAL_PATH_ENV).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let failed = |why: String| format!("{CREDENTIAL_PATH_ENV} {shown}: {why}");
    let metadata = std::fs::metadata(&path).map_err(|e| failed(e.to_string()))?;
    if !metadata.is_file() || metadata.len() > MAX_FILE_BYTES {
        return Err(failed(format!(
            "must be a regular file of at most {MAX_FILE_BYTES} bytes"
        )));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| failed(e.to_string()))?;
    lookup(&text, cloud, location).map_err(failed)
}

/// The entry of the credential file `text` for `location`.
fn lookup(text: &str, cloud: Cloud, location: &str) -> Result<Option<Credential>, String> {
    let file: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(match cloud {
        Cloud::S3 => longest(&file.s3, location).map(Credential::S3),
        Cloud::Gcs => longest(&file.gs, location).map(Credential::Gcs),
        Cloud::Azure => longest(&file.azure, location).map(Credential::Azure),
    })
}

/// The value whose key is the longest prefix of `location`.
fn longest<T: Clone>(entries: &BTreeMap<String, T>, location: &str) -> Option<T> {
    entries
        .iter()
        .filter(|(prefix, _)| location.starts_with(prefix.as_str()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, value)| value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{
      "gs": { "": "/default.json", "gs://gcs-bucket-002": "/second.json" },
      "s3": {
        "": { "secret_key": "s1", "key_id": "k1", "region": "r1", "session_token": "", "profile": "" },
        "s3://s3-bucket-002": { "secret_key": "s2", "key_id": "k2", "region": "r2", "session_token": "t2" }
      },
      "as": { "as://Account-002/Container": { "account_str": "Account-002", "account_key": "a2" } }
    }"#;

    fn s3(key: &str, secret: &str, region: &str, token: &str) -> Credential {
        Credential::S3(S3Credential {
            key_id: key.into(),
            secret_key: secret.into(),
            region: region.into(),
            session_token: token.into(),
            profile: String::new(),
        })
    }

    #[test]
    fn the_longest_matching_prefix_wins() {
        let found = |cloud, location| lookup(FILE, cloud, location).unwrap();
        assert_eq!(
            found(Cloud::S3, "s3://other/models"),
            Some(s3("k1", "s1", "r1", ""))
        );
        assert_eq!(
            found(Cloud::S3, "s3://s3-bucket-002/models"),
            Some(s3("k2", "s2", "r2", "t2"))
        );
        assert_eq!(
            found(Cloud::Gcs, "gs://gcs-bucket-002/m"),
            Some(Credential::Gcs("/second.json".into()))
        );
        assert_eq!(
            found(Cloud::Gcs, "gs://elsewhere"),
            Some(Credential::Gcs("/default.json".into()))
        );
        // No "" entry for Azure: only the container named matches.
        assert_eq!(found(Cloud::Azure, "as://Account-001/Container/m"), None);
        assert_eq!(
            found(Cloud::Azure, "as://Account-002/Container/m"),
            Some(Credential::Azure(AzureCredential {
                account_str: "Account-002".into(),
                account_key: "a2".into()
            }))
        );
    }

    #[test]
    fn missing_clouds_match_nothing_and_bad_files_are_refused() {
        assert_eq!(lookup("{}", Cloud::S3, "s3://b"), Ok(None));
        assert!(lookup("not json", Cloud::S3, "s3://b").is_err());
        assert!(lookup(r#"{"s3": {"": "not an object"}}"#, Cloud::S3, "s3://b").is_err());
    }
}
