//! Loading a model on its first request (`--load-on-demand`, off by default, in the `explicit`
//! and `poll` control modes): an inference, metadata or config request for a model the
//! repository holds but has not loaded loads it, and goes on once it is loaded.
//!
//! - Requests for a model that is loading wait on that one load (each within its own deadline:
//!   a request whose client goes away stops waiting, the load goes on).
//! - A load that fails is answered with its error, Triton's load-failure text, and not tried
//!   again for [`FIRST_BACKOFF`], doubling with each failure up to [`MAX_BACKOFF`]: a broken model
//!   costs one load attempt per backoff, not one per request. A load by the repository API
//!   (or a poll) is not held back.
//! - A name no store holds is remembered for [`UNKNOWN_FOR`] in a bounded cache
//!   ([`MAX_UNKNOWN`] names), so a flood of unknown names costs one store lookup each per period,
//!   not one per request (a remote store's lookup is a request of its own).

use super::Engine;
use crate::core::Error;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a failed load is answered with its error before it is tried again; each failure in
/// a row doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two load attempts of a model that keeps failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a name no store holds is answered without asking the stores again.
pub const UNKNOWN_FOR: Duration = Duration::from_secs(5);
/// The most unknown names remembered at once; past it the oldest are forgotten.
pub const MAX_UNKNOWN: usize = 10_000;

/// On-demand loads by outcome: `success`, `failure`, and `backoff` for the requests answered
/// with a failure's error without a load.
pub const LOADS: &str = "kiln_model_loads_on_demand_total";
/// How long on-demand loads took, in seconds (a summary).
pub const LOAD_SECONDS: &str = "kiln_model_load_on_demand_seconds";

/// Counts one on-demand load that took `took` and succeeded or not, in [`LOADS`] and
/// [`LOAD_SECONDS`].
fn record_load(took: Duration, succeeded: bool) {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(|| {
        metrics::describe_counter!(LOADS, "Model loads a request started (--load-on-demand)");
        metrics::describe_histogram!(
            LOAD_SECONDS,
            metrics::Unit::Seconds,
            "Duration of model loads a request started (--load-on-demand)"
        );
    });
    let outcome = if succeeded { "success" } else { "failure" };
    metrics::counter!(LOADS, "outcome" => outcome).increment(1);
    metrics::histogram!(LOAD_SECONDS).record(took.as_secs_f64());
}

/// Triton's answer for a model no repository holds.
fn unknown(name: &str) -> Error {
    Error::NotFound(format!("Request for unknown model: '{name}' is not found"))
}

/// A load in progress, which every request for the model waits on.
type Loading = Shared<BoxFuture<'static, Result<(), Error>>>;

/// What the engine remembers of the loads it started on demand.
#[derive(Default)]
pub(super) struct OnDemand {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    loading: HashMap<String, Loading>,
    /// A model whose last load failed: its error, when it may be tried again, and its backoff.
    failed: HashMap<String, (Error, Instant, Duration)>,
    /// Names no store held, and when that was found.
    unknown: HashMap<String, Instant>,
}

/// What to do about a request for a model that is not loaded.
enum Next {
    /// Wait for this load (started now, or by an earlier request).
    Wait(Loading),
    /// Go on: it was loaded meanwhile.
    Loaded,
    /// Answer this error (a recent failure).
    Answer(Error),
}

impl OnDemand {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `name` was found unknown within [`UNKNOWN_FOR`].
    fn known_unknown(&self, name: &str, now: Instant) -> bool {
        self.lock()
            .unknown
            .get(name)
            .is_some_and(|&at| now.duration_since(at) < UNKNOWN_FOR)
    }

    /// Remembers that no store holds `name`, forgetting the oldest names past [`MAX_UNKNOWN`].
    fn remember_unknown(&self, name: &str, now: Instant) {
        let mut state = self.lock();
        if state.unknown.len() >= MAX_UNKNOWN {
            state
                .unknown
                .retain(|_, &mut at| now.duration_since(at) < UNKNOWN_FOR);
        }
        if state.unknown.len() >= MAX_UNKNOWN {
            let mut ages: Vec<Instant> = state.unknown.values().copied().collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            state.unknown.retain(|_, &mut at| at > cut);
        }
        state.unknown.insert(name.to_string(), now);
    }

    /// The load of `name` to wait for, started with `start` if none runs, it was not `loaded`
    /// meanwhile (a load ends its entry after it has committed its versions, so one of the two
    /// holds for a load that ran since the request looked) and none failed lately.
    fn next(
        &self,
        name: &str,
        now: Instant,
        loaded: impl FnOnce() -> bool,
        start: impl FnOnce() -> Loading,
    ) -> Next {
        let mut state = self.lock();
        if let Some(loading) = state.loading.get(name) {
            return Next::Wait(loading.clone());
        }
        if loaded() {
            return Next::Loaded;
        }
        if let Some((error, until, _)) = state.failed.get(name) {
            if now < *until {
                return Next::Answer(error.clone());
            }
        }
        let loading = start();
        state.loading.insert(name.to_string(), loading.clone());
        Next::Wait(loading)
    }

    /// No store holds `name`: its lookup has ended, and the name is remembered if a store could
    /// hold it (at most 255 bytes; one no store can hold costs no lookup to answer again, and a
    /// flood of long names no memory).
    fn unknown(&self, name: &str, now: Instant) {
        self.lock().loading.remove(name);
        if crate::repository::store::validate_name(name).is_ok() {
            self.remember_unknown(name, now);
        }
    }

    /// The load of `name` ended with `result`: a failure is answered until its backoff ends.
    fn finished(&self, name: &str, result: &Result<(), Error>) {
        let mut state = self.lock();
        state.loading.remove(name);
        match result {
            Ok(()) => {
                state.failed.remove(name);
            }
            Err(error) => {
                let backoff = state
                    .failed
                    .get(name)
                    .map_or(FIRST_BACKOFF, |&(_, _, last)| (last * 2).min(MAX_BACKOFF));
                let until = Instant::now() + backoff;
                state
                    .failed
                    .insert(name.to_string(), (error.clone(), until, backoff));
            }
        }
    }
}

impl Engine {
    /// Loads models on their first request (see the module doc).
    pub fn with_load_on_demand(mut self, on: bool) -> Engine {
        self.on_demand = on.then(|| Arc::new(OnDemand::default()));
        self
    }

    /// [`Engine::target`], loading the model first when it is not loaded and the server loads
    /// models on demand.
    ///
    /// # Errors
    /// As [`Engine::target`]; the load's error when the model fails to load (or failed within
    /// its backoff).
    pub async fn target_loading(&self, name: &str, version: &str) -> Result<super::Target, Error> {
        let found = self.target(name, version);
        match (&found, &self.on_demand) {
            (Err(_), Some(on_demand)) if !self.has_serving(name) => {
                self.load_on_demand(on_demand, name).await?;
                self.target(name, version)
            }
            _ => found,
        }
    }

    /// Whether `name` has a version loaded (ready or not yet serving).
    fn has_serving(&self, name: &str) -> bool {
        self.repository
            .snapshot()
            .get(name)
            .is_some_and(|slot| slot.serving.is_some())
    }

    /// Loads `name` for a request, or waits for its load (see the module doc).
    async fn load_on_demand(&self, on_demand: &Arc<OnDemand>, name: &str) -> Result<(), Error> {
        let now = Instant::now();
        if on_demand.known_unknown(name, now) {
            return Err(unknown(name));
        }
        // One task asks the stores and loads: the requests that come meanwhile, and those within
        // a failure's backoff, wait or are answered without asking the stores again.
        let start = || {
            let repository = Arc::clone(&self.repository);
            let (tracked, name) = (Arc::clone(on_demand), name.to_string());
            async move {
                let loading = name.clone();
                let began = Instant::now();
                let loaded = tokio::task::spawn_blocking(move || {
                    repository
                        .holds(&loading)
                        .then(|| repository.load_on_demand(&loading))
                })
                .await
                .unwrap_or_else(|e| {
                    Some(Err(Error::Internal(format!("model load task failed: {e}"))))
                });
                let Some(result) = loaded else {
                    tracked.unknown(&name, Instant::now());
                    return Err(unknown(&name));
                };
                record_load(began.elapsed(), result.is_ok());
                tracked.finished(&name, &result);
                result
            }
            .boxed()
            .shared()
        };
        match on_demand.next(name, now, || self.has_serving(name), start) {
            Next::Wait(loading) => loading.await,
            Next::Loaded => Ok(()),
            Next::Answer(error) => {
                metrics::counter!(LOADS, "outcome" => "backoff").increment(1);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Loading {
        async { Ok(()) }.boxed().shared()
    }

    #[test]
    fn requests_share_one_load_and_a_failure_backs_off() {
        let on_demand = OnDemand::default();
        let now = Instant::now();
        let mut started = 0;
        for _ in 0..3 {
            let next = on_demand.next(
                "m",
                now,
                || false,
                || {
                    started += 1;
                    ready()
                },
            );
            assert!(matches!(next, Next::Wait(_)));
        }
        assert_eq!(started, 1, "one load for every waiting request");
        let failure = Err(Error::InvalidArgument("bad config".into()));
        on_demand.finished("m", &failure);
        // Within the backoff the failure is answered, no load starts.
        let next = on_demand.next(
            "m",
            Instant::now(),
            || false,
            || unreachable!("backing off"),
        );
        assert!(matches!(next, Next::Answer(Error::InvalidArgument(_))));
        // Past it, one more try; a second failure doubles the backoff.
        let later = Instant::now() + FIRST_BACKOFF;
        assert!(matches!(
            on_demand.next("m", later, || false, ready),
            Next::Wait(_)
        ));
        on_demand.finished("m", &failure);
        let (_, _, backoff) = on_demand.lock().failed["m"].clone();
        assert_eq!(backoff, FIRST_BACKOFF * 2);
        on_demand.finished("m", &Ok(()));
        assert!(on_demand.lock().failed.is_empty());
        // A load that ran since the request looked is not run again.
        assert!(matches!(
            on_demand.next("m", later, || true, || unreachable!("loaded")),
            Next::Loaded
        ));
    }

    #[test]
    fn unknown_names_are_remembered_for_a_while_in_a_bounded_cache() {
        let on_demand = OnDemand::default();
        let now = Instant::now();
        on_demand.remember_unknown("nope", now);
        assert!(on_demand.known_unknown("nope", now));
        assert!(!on_demand.known_unknown("nope", now + UNKNOWN_FOR));
        for i in 0..MAX_UNKNOWN + 10 {
            on_demand.remember_unknown(&format!("n{i}"), now + Duration::from_micros(i as u64));
        }
        assert!(on_demand.lock().unknown.len() <= MAX_UNKNOWN);
    }
}
