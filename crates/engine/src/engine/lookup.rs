//! Finding what serves a request: the model by name and the version asked for, or the newest
//! one, from the repository's current snapshot, with Triton's messages when there is none.

use super::Engine;
use crate::core::Error;
use crate::invalid_arg;
use crate::repository::{LoadFailure, Model, ServingVersion, Status};
use std::sync::Arc;

impl Engine {
    /// Finds the model and the version to serve: the given one, or the newest ready one. Both
    /// come out of the current snapshot by `Arc`, so a reload or unload that happens meanwhile
    /// lets this request finish on what it resolved. An ensemble a step of which is not served
    /// is not available, as in Triton (which unloads it with the step, and loads it again with
    /// it).
    pub(super) fn resolve(
        &self,
        name: &str,
        version: &str,
    ) -> Result<(Arc<Model>, Arc<ServingVersion>), Error> {
        let (model, serving) = self.resolve_loaded(name, version)?;
        if self.serves(&serving, 0) {
            return Ok((model, serving));
        }
        Err(if version.is_empty() {
            Error::NotFound(format!(
                "Request for unknown model: '{name}' has no available versions"
            ))
        } else {
            Error::Unavailable(format!(
                "Request for unknown model: '{name}' version {} is not at ready state",
                serving.version
            ))
        })
    }

    /// [`Engine::resolve`], whether or not an ensemble's steps are served.
    pub(super) fn resolve_loaded(
        &self,
        name: &str,
        version: &str,
    ) -> Result<(Arc<Model>, Arc<ServingVersion>), Error> {
        let snapshot = self.repository.snapshot();
        let slot = snapshot.get(name).ok_or_else(|| {
            Error::NotFound(format!("Request for unknown model: '{name}' is not found"))
        })?;
        let model = slot.serving.clone();
        if version.is_empty() {
            let latest = model.as_ref().and_then(|m| m.latest()).cloned();
            return match (model, latest) {
                (Some(model), Some(serving)) => Ok((model, serving)),
                _ => Err(Error::NotFound(format!(
                    "Request for unknown model: '{name}' has no available versions"
                ))),
            };
        }
        let number = parse_version(version)?;
        if let Some(model) = model {
            if let Some(serving) = model.versions.get(&number) {
                return Ok((Arc::clone(&model), Arc::clone(serving)));
            }
        }
        let known = match &slot.status {
            Status::Loading { versions } | Status::Unloaded { versions } => {
                versions.contains(&number)
            }
            Status::Failed(LoadFailure::Versions(reasons)) => reasons.contains_key(&number),
            Status::Failed(_) | Status::Ready => false,
        };
        if known {
            Err(Error::Unavailable(format!(
                "Request for unknown model: '{name}' version {number} is not at ready state"
            )))
        } else {
            Err(Error::NotFound(format!(
                "Request for unknown model: '{name}' version {number} is not found"
            )))
        }
    }
}

/// Parses a version string as Triton does: an integer greater than zero.
pub(super) fn parse_version(version: &str) -> Result<i64, Error> {
    // Triton (server src/common.cc, GetModelVersionFromString): a number std::stol reads but
    // below 0 has a text of its own, with its space before the comma.
    if version.parse::<i64>().is_ok_and(|v| v < 0) {
        return Err(invalid_arg!(
            "invalid model version specified '{version}' , version should be an integral value > 0"
        ));
    }
    version.parse::<i64>().ok().filter(|&v| v > 0).ok_or_else(|| {
        invalid_arg!(
            "failed to get model version from specified version string '{version}' (details: stol), \
             version should be an integral value > 0"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_strings() {
        assert_eq!(parse_version("3"), Ok(3));
        for bad in ["abc", "0", "-1", "1.5", " 1", "99999999999999999999"] {
            let err = parse_version(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad}");
            assert!(err.message().contains(&format!("'{bad}'")));
        }
        assert_eq!(
            parse_version("-1").unwrap_err().message(),
            "invalid model version specified '-1' , version should be an integral value > 0"
        );
    }
}
