//! Version directories and version policies (latest N, all, specific).

use super::limits::{too_many_entries, MAX_MODEL_DIR_ENTRIES};
use crate::proto::inference::{model_version_policy::PolicyChoice, ModelConfig};
use std::path::Path;

/// The versions the model's policy selects, ascending; evaluated again on every (re)load.
/// Version directories have numeric names; names with a leading zero are ignored, as Triton does,
/// and so are numbers too large for a version (with a warning). A `specific` policy naming a
/// version that has no directory skips it with a warning (Triton's behaviour), so the versions
/// that exist still load.
///
/// # Errors
/// The I/O error when the model directory cannot be listed, or a listing longer than
/// [`MAX_MODEL_DIR_ENTRIES`].
pub fn select(dir: &Path, config: &ModelConfig) -> Result<Vec<i64>, String> {
    let mut on_disk = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("failed to list {}: {e}", dir.display()))?;
    for (index, entry) in entries.flatten().enumerate() {
        if index == MAX_MODEL_DIR_ENTRIES {
            return Err(too_many_entries(&config.name));
        }
        if !entry.path().is_dir() {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        match parse_version_dir(name) {
            Some(version) => on_disk.push(version),
            None if !name.starts_with('0') && name.bytes().all(|b| b.is_ascii_digit()) => {
                tracing::warn!(
                    model = %config.name,
                    "version directory '{name}' of model '{}' is ignored: versions go up to {}",
                    config.name,
                    i64::MAX
                );
            }
            None => {}
        }
    }
    on_disk.sort_unstable();
    if let Some(PolicyChoice::Specific(specific)) = config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        for missing in specific.versions.iter().filter(|v| !on_disk.contains(v)) {
            tracing::warn!(
                model = %config.name,
                "version {missing} is specified for model '{}', but the version directory is not present",
                config.name
            );
        }
    }
    Ok(apply_policy(
        &on_disk,
        config
            .version_policy
            .as_ref()
            .and_then(|p| p.policy_choice.as_ref()),
    ))
}

fn parse_version_dir(name: &str) -> Option<i64> {
    if name.starts_with('0') || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// Applies a policy to the sorted versions found on disk.
pub fn apply_policy(on_disk: &[i64], policy: Option<&PolicyChoice>) -> Vec<i64> {
    match policy {
        None => on_disk.iter().rev().take(1).copied().collect(),
        Some(PolicyChoice::Latest(latest)) => {
            let n = latest.num_versions.max(1) as usize;
            on_disk[on_disk.len().saturating_sub(n)..].to_vec()
        }
        Some(PolicyChoice::All(_)) => on_disk.to_vec(),
        Some(PolicyChoice::Specific(specific)) => {
            let mut versions: Vec<i64> = specific
                .versions
                .iter()
                .copied()
                .filter(|v| on_disk.contains(v))
                .collect();
            versions.sort_unstable();
            versions.dedup();
            versions
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::model_version_policy::{All, Latest, Specific};

    #[test]
    fn version_dir_names() {
        assert_eq!(parse_version_dir("1"), Some(1));
        assert_eq!(parse_version_dir("42"), Some(42));
        assert_eq!(parse_version_dir("01"), None);
        assert_eq!(parse_version_dir("0"), None);
        assert_eq!(parse_version_dir("v1"), None);
        assert_eq!(parse_version_dir(""), None);
        assert_eq!(parse_version_dir("99999999999999999999999"), None);
        assert_eq!(parse_version_dir("9223372036854775807"), Some(i64::MAX));
    }

    #[test]
    fn long_listings_are_refused() {
        let dir = std::env::temp_dir().join(format!("kiln-versions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for version in 1..=MAX_MODEL_DIR_ENTRIES {
            std::fs::create_dir_all(dir.join(version.to_string())).unwrap();
        }
        let config = ModelConfig {
            name: "m".into(),
            ..Default::default()
        };
        assert_eq!(select(&dir, &config).unwrap(), vec![1024]);
        std::fs::create_dir_all(dir.join("99999999999999999999")).unwrap();
        let refused = select(&dir, &config).unwrap_err();
        assert_eq!(
            refused,
            "the directory of model 'm' holds more than 1024 entries (version directories and \
             files), more than kiln reads"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn policies() {
        let disk = [1, 2, 3];
        assert_eq!(apply_policy(&disk, None), vec![3]);
        let latest = |n| PolicyChoice::Latest(Latest { num_versions: n });
        assert_eq!(apply_policy(&disk, Some(&latest(2))), vec![2, 3]);
        assert_eq!(apply_policy(&disk, Some(&latest(9))), vec![1, 2, 3]);
        assert_eq!(apply_policy(&disk, Some(&latest(0))), vec![3]);
        assert_eq!(
            apply_policy(&disk, Some(&PolicyChoice::All(All {}))),
            vec![1, 2, 3]
        );
        let specific = PolicyChoice::Specific(Specific {
            versions: vec![3, 1, 3, 7],
        });
        assert_eq!(apply_policy(&disk, Some(&specific)), vec![1, 3]);
        assert_eq!(apply_policy(&[], None), Vec::<i64>::new());
    }
}
