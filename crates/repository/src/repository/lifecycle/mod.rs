//! The mutable repository: which models serve, in which state every known model is, and the
//! operations that change it (start-up load, explicit load and unload, polling).
//!
//! Requests never wait on a load. They take a snapshot (an `Arc` of an immutable map, swapped
//! whole under a short write lock) and keep the model and version they resolved by `Arc`. A
//! (re)load builds the new version set beside the old one without touching the snapshot, then
//! swaps it in at once; the versions that no longer serve go to the [`Retirer`], which stops
//! them when their last in-flight request has finished. A failed reload leaves the old versions
//! serving. Operations on one model are serialised; different models load in parallel. Every
//! change bumps a watch channel so readiness (and the gRPC health service) follow it.

mod operations;

use super::index::{self, IndexEntry};
use super::loader::LoadFailure;
use super::retire::Retirer;
use super::store::{Fingerprint, ModelStore};
use super::{LoadOptions, Model};
use crate::core::Error;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;
use tracing::warn;

/// `--model-control-mode`, as `tritonserver` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMode {
    /// Load every model at start-up; ignore later changes; no load/unload API.
    None,
    /// As `None`, then re-scan the repository periodically and apply what changed.
    Poll,
    /// Load only `--load-model` models at start-up; then only the load/unload API changes models.
    Explicit,
}

/// How the repository behaves.
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    pub mode: ControlMode,
    /// `--load-model` names for explicit mode; `["*"]` loads every model.
    pub startup_models: Vec<String>,
    pub load: LoadOptions,
    /// Models loaded at once at start-up and by a poll (`--model-load-thread-count`).
    pub load_threads: usize,
    /// Times a failed load from the store is tried again (`--model-load-retry-count`).
    pub load_retries: u32,
    /// `--load-on-demand`: requests load models, so poll mode loads none at start-up and polls
    /// only the models loaded (reloading what changed, unloading what is gone).
    pub load_on_demand: bool,
}

impl Default for RepositoryOptions {
    /// Control mode `none`, Triton's four loading threads and no retries.
    fn default() -> RepositoryOptions {
        RepositoryOptions {
            mode: ControlMode::None,
            startup_models: Vec::new(),
            load: LoadOptions::default(),
            load_threads: 4,
            load_retries: 0,
            load_on_demand: false,
        }
    }
}

/// The lifecycle state of a model that is not simply serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// A load runs; the versions it builds once its policy is known. A model being reloaded
    /// keeps serving its old versions meanwhile.
    Loading { versions: Vec<i64> },
    /// Serving (`Slot::serving` is set); also after a failed reload, since the old versions serve.
    Ready,
    /// The last load of a model that does not serve failed.
    Failed(LoadFailure),
    /// Unloaded; its versions are UNLOADING until their sessions are freed.
    Unloaded { versions: Vec<i64> },
}

/// Everything known about one model name.
#[derive(Clone)]
pub struct Slot {
    /// What serves requests now.
    pub serving: Option<Arc<Model>>,
    pub status: Status,
    /// The server is only ready (strict readiness) when every expected model serves: models to
    /// load at start-up, models in the repository in poll mode, models loaded through the API.
    pub expected: bool,
    /// Fingerprint of the files `serving` was built from: versions whose files still match are
    /// kept on a poll-triggered reload.
    loaded: Option<Fingerprint>,
    /// Fingerprint at the last load attempt: polling reloads only when the files differ from it.
    seen: Option<Fingerprint>,
    /// Loaded from override files rather than a store (polling leaves it alone).
    from_override: bool,
}

impl Slot {
    fn new(expected: bool) -> Slot {
        Slot {
            serving: None,
            status: Status::Loading {
                versions: Vec::new(),
            },
            expected,
            loaded: None,
            seen: None,
            from_override: false,
        }
    }
}

/// What requests read: every known model by name.
pub type Snapshot = BTreeMap<String, Slot>;

const NOT_EXPLICIT: &str = "explicit model load / unload is not allowed if polling is enabled";

/// The repository and the lifecycle of its models.
pub struct ModelRepository {
    /// Where models come from, searched in order: `--model-repository` (repeatable), then the
    /// repositories registered while running (SageMaker's multi-model endpoints).
    stores: RwLock<Vec<Arc<dyn ModelStore>>>,
    options: RepositoryOptions,
    /// The current snapshot; writers replace the `Arc`, readers clone it and let go of the lock.
    state: RwLock<Arc<Snapshot>>,
    /// One lock per model name, held for a whole load or unload; an entry lives only while an
    /// operation holds or waits for it, so the names clients make up do not pile up here.
    operations: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    retirer: Retirer,
    /// Bumped on every change of state, so watchers re-evaluate readiness.
    changes: Arc<watch::Sender<u64>>,
    /// Set once the start-up load has run (whatever its outcome).
    started: AtomicBool,
}

impl ModelRepository {
    /// A repository over `stores` (a model name is looked up in them in order). Nothing is read
    /// or loaded yet: see [`ModelRepository::load_startup`].
    ///
    /// # Errors
    /// The OS error when the retirement thread cannot start.
    pub fn new(
        stores: Vec<Box<dyn ModelStore>>,
        options: RepositoryOptions,
    ) -> std::io::Result<ModelRepository> {
        let changes = Arc::new(watch::Sender::new(0u64));
        let notify = Arc::clone(&changes);
        Ok(ModelRepository {
            stores: RwLock::new(stores.into_iter().map(Arc::from).collect()),
            options,
            state: RwLock::new(Arc::new(Snapshot::new())),
            operations: Mutex::new(HashMap::new()),
            retirer: Retirer::start(move || notify.send_modify(|n| *n += 1))?,
            changes,
            started: AtomicBool::new(false),
        })
    }

    pub fn mode(&self) -> ControlMode {
        self.options.mode
    }

    /// How this repository's Python models call other models: the server connects it to its
    /// engine.
    pub fn python_calls(&self) -> &crate::backend::python::ModelCaller {
        &self.options.load.python_calls
    }

    /// The current state; cheap (one `Arc` clone under a read lock).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// A receiver that changes whenever any model's state does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether the start-up load has finished.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Strict readiness: the start-up load has finished and every expected model serves.
    pub fn all_expected_ready(&self) -> bool {
        self.started()
            && self
                .snapshot()
                .values()
                .all(|s| !s.expected || s.serving.is_some())
    }

    /// The repository index: every model directory in the stores and every model known
    /// otherwise, with the state of each version (see [`index`]).
    pub fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let on_disk: BTreeSet<String> = self.list().into_keys().collect();
        index::render(&on_disk, &self.snapshot(), ready_only, |model, version| {
            self.retirer.is_retiring(model, version)
        })
    }

    fn require_explicit(&self) -> Result<(), Error> {
        match self.options.mode {
            ControlMode::Explicit => Ok(()),
            ControlMode::None | ControlMode::Poll => Err(Error::Unavailable(NOT_EXPLICIT.into())),
        }
    }

    /// The stores, in search order.
    fn stores(&self) -> Vec<Arc<dyn ModelStore>> {
        self.stores
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Adds a repository to search after the others (Triton's RegisterModelRepository).
    ///
    /// # Errors
    /// ALREADY_EXISTS when a repository at the same location is registered, or when the new one
    /// holds a model name another repository holds.
    pub fn register_store(&self, store: Arc<dyn ModelStore>) -> Result<(), Error> {
        let location = store.location();
        let names = store
            .list()
            .map_err(|e| Error::InvalidArgument(format!("failed to register '{location}': {e}")))?;
        let already = || {
            Error::AlreadyExists(format!(
                "model repository '{location}' has already been registered"
            ))
        };
        if self.stores().iter().any(|s| s.location() == location) {
            return Err(already());
        }
        // One listing per store, outside the lock (a remote store lists over the network).
        let listed = self.list();
        if let Some(taken) = names.iter().find(|name| listed.contains_key(*name)) {
            return Err(Error::AlreadyExists(format!(
                "failed to register '{location}', there is a conflicting mapping for '{taken}'"
            )));
        }
        let mut stores = self.stores.write().unwrap_or_else(|p| p.into_inner());
        if stores.iter().any(|s| s.location() == location) {
            return Err(already());
        }
        stores.push(store);
        Ok(())
    }

    /// Removes a registered repository (Triton's UnregisterModelRepository); its models stay
    /// loaded until they are unloaded.
    ///
    /// # Errors
    /// NOT_FOUND when no repository at `location` is registered.
    pub fn unregister_store(&self, location: &str) -> Result<(), Error> {
        let mut stores = self.stores.write().unwrap_or_else(|p| p.into_inner());
        let before = stores.len();
        stores.retain(|s| s.location() != location);
        if stores.len() == before {
            return Err(Error::NotFound(format!(
                "failed to unregister '{location}', repository not found"
            )));
        }
        Ok(())
    }

    /// Model names in the stores, each with the first store that holds it.
    fn list(&self) -> BTreeMap<String, Arc<dyn ModelStore>> {
        let mut names: BTreeMap<String, Arc<dyn ModelStore>> = BTreeMap::new();
        for store in self.stores() {
            match store.list() {
                Ok(listed) => {
                    for name in listed {
                        if let Some(first) = names.get(&name) {
                            if !Arc::ptr_eq(first, &store) {
                                warn!(model = %name, "model name appears in more than one repository; keeping the first");
                            }
                            continue;
                        }
                        names.insert(name, Arc::clone(&store));
                    }
                }
                Err(e) => {
                    warn!(repository = %store.location(), "cannot read model repository: {e}")
                }
            }
        }
        names
    }

    /// Runs `operation` holding `name`'s lock, so loads and unloads of one model never overlap.
    fn with_model_lock<T>(&self, name: &str, operation: impl FnOnce() -> T) -> T {
        let lock = {
            let mut locks = self.operations.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(locks.entry(name.to_string()).or_default())
        };
        let done = {
            let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
            operation()
        };
        // Clones are only taken under the map's lock: two references (the map's and this one)
        // mean that no other operation holds or waits for it.
        let mut locks = self.operations.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) == 2 {
            locks.remove(name);
        }
        done
    }

    /// Replaces one slot (`None` removes it) and returns the previous one.
    fn update(
        &self,
        name: &str,
        change: impl FnOnce(Option<&Slot>) -> Option<Slot>,
    ) -> Option<Slot> {
        let mut previous = None;
        self.update_all(|slots| {
            previous = slots.get(name).cloned();
            match change(previous.as_ref()) {
                Some(slot) => slots.insert(name.to_string(), slot),
                None => slots.remove(name),
            };
        });
        previous
    }

    fn update_all(&self, change: impl FnOnce(&mut Snapshot)) {
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            let mut slots = (**state).clone();
            change(&mut slots);
            *state = Arc::new(slots);
        }
        self.notify();
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests;
