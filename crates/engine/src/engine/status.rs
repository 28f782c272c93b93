//! What the status page (`/console`) reads besides Triton's APIs: the server's uptime and each
//! serving version's latency histograms.

use super::Engine;
use crate::metrics::latency::LatencyHistogram;
use std::time::Duration;

/// One serving version's cumulative latency histograms.
pub struct VersionLatencies {
    pub model: String,
    pub version: String,
    /// End to end, successful requests.
    pub request: LatencyHistogram,
    /// Time in the queue, successful requests.
    pub queue: LatencyHistogram,
}

impl Engine {
    /// How long the server has run.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The latency histograms of every serving version (the versions `model_statistics` lists).
    pub fn latencies(&self) -> Vec<VersionLatencies> {
        let snapshot = self.repository.snapshot();
        let mut out = Vec::new();
        for (name, slot) in snapshot.iter() {
            let Some(model) = slot.serving.as_deref() else {
                continue;
            };
            for (version, serving) in &model.versions {
                if !self.serves(serving, 0) {
                    continue;
                }
                let (request, queue) = serving.stats.latencies();
                out.push(VersionLatencies {
                    model: name.clone(),
                    version: version.to_string(),
                    request,
                    queue,
                });
            }
        }
        out
    }
}
