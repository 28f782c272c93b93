//! The repository index as Triton reports it: one entry per model directory (a model never
//! loaded is its name alone), otherwise one entry per known version with its state
//! (`READY`, `UNAVAILABLE`, `LOADING`, `UNLOADING`) and the reason for it (`unloaded` after an
//! unload; for a READY version whose `KIND_GPU` groups run on CPU under `--gpu-fallback-to-cpu`,
//! why). A model that failed before its versions were known is one versionless UNAVAILABLE
//! entry with the reason. `ready_only` keeps READY versions only.

use super::lifecycle::{Slot, Snapshot, Status};
use super::loader::LoadFailure;
use std::collections::BTreeSet;

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    /// Empty for a model without known versions.
    pub version: String,
    /// Empty for a model never loaded.
    pub state: String,
    pub reason: String,
}

impl IndexEntry {
    fn new(name: &str, version: Option<i64>, state: &str, reason: &str) -> IndexEntry {
        IndexEntry {
            name: name.to_string(),
            version: version.map(|v| v.to_string()).unwrap_or_default(),
            state: state.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Renders the index of the models in `on_disk` and in `slots`, sorted by name then version.
/// `retiring` tells whether an unloaded version still holds its sessions.
pub fn render(
    on_disk: &BTreeSet<String>,
    slots: &Snapshot,
    ready_only: bool,
    retiring: impl Fn(&str, i64) -> bool,
) -> Vec<IndexEntry> {
    let names: BTreeSet<&String> = on_disk.iter().chain(slots.keys()).collect();
    let mut entries = Vec::new();
    for name in names {
        match slots.get(name) {
            None => entries.push(IndexEntry::new(name, None, "", "")),
            Some(slot) => entries.extend(model_entries(name, slot, &retiring)),
        }
    }
    if ready_only {
        entries.retain(|e| e.state == "READY");
    }
    entries
}

fn model_entries(
    name: &str,
    slot: &Slot,
    retiring: &impl Fn(&str, i64) -> bool,
) -> Vec<IndexEntry> {
    // Versions that serve are READY whatever runs beside them (a reload keeps them serving);
    // the reason is empty unless GPU groups fell back to CPU.
    if let Some(model) = &slot.serving {
        let reason = model.fallback.as_deref().unwrap_or_default();
        return model
            .versions
            .keys()
            .map(|&v| IndexEntry::new(name, Some(v), "READY", reason))
            .collect();
    }
    match &slot.status {
        Status::Loading { versions } if versions.is_empty() => {
            vec![IndexEntry::new(name, None, "LOADING", "")]
        }
        Status::Loading { versions } => versions
            .iter()
            .map(|&v| IndexEntry::new(name, Some(v), "LOADING", ""))
            .collect(),
        Status::Failed(LoadFailure::Model(reason)) => {
            vec![IndexEntry::new(name, None, "UNAVAILABLE", reason.message())]
        }
        Status::Failed(LoadFailure::Versions(reasons)) => reasons
            .iter()
            .map(|(&v, failure)| IndexEntry::new(name, Some(v), "UNAVAILABLE", failure.reason()))
            .collect(),
        Status::Unloaded { versions } => versions
            .iter()
            .map(|&v| {
                if retiring(name, v) {
                    IndexEntry::new(name, Some(v), "UNLOADING", "")
                } else {
                    IndexEntry::new(name, Some(v), "UNAVAILABLE", "unloaded")
                }
            })
            .collect(),
        // Ready without a serving model does not happen; report the name alone.
        Status::Ready => vec![IndexEntry::new(name, None, "", "")],
    }
}
