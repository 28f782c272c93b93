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

use super::index::{self, IndexEntry};
use super::loader::{self, LoadFailure};
use super::overrides::{self, LoadParameter, OverrideDir};
use super::retire::Retirer;
use super::store::{validate_name, Fingerprint, ModelStore};
use super::{LoadOptions, Model};
use crate::core::Error;
use crate::proto::inference::ModelConfig;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;
use tracing::{info, warn};

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
}

/// The lifecycle state of a model that is not simply serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// A load runs; the versions it builds once its policy is known. A model being reloaded
    /// keeps serving its old versions meanwhile.
    Loading {
        versions: Vec<i64>,
    },
    Ready,
    /// The last load of a model that does not serve failed.
    Failed(LoadFailure),
    /// Unloaded; its versions are UNLOADING until their sessions are freed.
    Unloaded {
        versions: Vec<i64>,
    },
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
    stores: Vec<Box<dyn ModelStore>>,
    options: RepositoryOptions,
    state: RwLock<Arc<Snapshot>>,
    /// One lock per model name, held for a whole load or unload.
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
            stores,
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

    /// Loads what the control mode loads at start-up; blocking. Failures are recorded per model.
    pub fn load_startup(&self) {
        let names: Vec<String> = match self.options.mode {
            ControlMode::Explicit if self.options.startup_models != ["*"] => {
                self.options.startup_models.clone()
            }
            _ => self.list().into_keys().collect(),
        };
        self.update_all(|slots| {
            for name in &names {
                slots.insert(name.clone(), Slot::new(true));
            }
        });
        for name in &names {
            let _ = self.load_from_store(name, false);
        }
        self.started.store(true, Ordering::SeqCst);
        self.notify();
        let snapshot = self.snapshot();
        let ready = names
            .iter()
            .filter(|n| snapshot.get(*n).is_some_and(|s| s.serving.is_some()))
            .count();
        info!(
            "start-up model loading finished: {ready} of {} models ready",
            names.len()
        );
    }

    /// The load API: loads, or reloads, `name` with optional `config` / `file:` overrides.
    /// Blocking: run it off the async runtime.
    ///
    /// # Errors
    /// Triton's answers: UNAVAILABLE outside explicit mode, INVALID_ARGUMENT for a bad name or
    /// parameter or a failed load, INTERNAL for a model no store holds.
    pub fn load(
        &self,
        name: &str,
        parameters: BTreeMap<String, LoadParameter>,
    ) -> Result<(), Error> {
        self.require_explicit()?;
        validate_name(name).map_err(Error::InvalidArgument)?;
        let overrides = overrides::parse(parameters)?;
        if overrides.files.is_empty() {
            return self.with_model_lock(name, || self.load_locked(name, overrides.config, false));
        }
        let dir = OverrideDir::write(name, &overrides.files)?;
        self.with_model_lock(name, || {
            let source = Source {
                dir: dir.path().to_path_buf(),
                fingerprint: None,
                from_override: true,
            };
            self.build_and_commit(name, source, overrides.config, false)
        })
    }

    /// The unload API: the model stops serving at once; requests already running finish, then
    /// its sessions are freed (the index says UNLOADING until then). Unloading a model that is
    /// not loaded succeeds, as in Triton. `unload_dependents` is accepted; kiln has no ensembles,
    /// so there are no dependents.
    ///
    /// # Errors
    /// UNAVAILABLE outside explicit mode; INVALID_ARGUMENT for a bad name.
    pub fn unload(&self, name: &str) -> Result<(), Error> {
        self.require_explicit()?;
        validate_name(name).map_err(Error::InvalidArgument)?;
        self.with_model_lock(name, || {
            self.unload_locked(name, false);
            Ok(())
        })
    }

    /// One poll: loads new models, reloads changed ones (keeping versions whose files did not
    /// change), unloads models whose directory is gone. Blocking.
    pub fn poll(&self) {
        let listed = self.list();
        for (name, store) in &listed {
            let fingerprint = self.stores[*store].fingerprint(name).ok();
            let snapshot = self.snapshot();
            let changed = match snapshot.get(name) {
                None => {
                    info!(model = %name, "new model in the repository");
                    self.update(name, |_| Some(Slot::new(true)));
                    true
                }
                Some(slot) => slot.from_override || slot.seen != fingerprint,
            };
            if changed {
                let _ = self.load_from_store(name, true);
            }
        }
        for (name, slot) in self.snapshot().iter() {
            if !listed.contains_key(name) && !slot.from_override {
                info!(model = %name, "model directory removed from the repository");
                self.with_model_lock(name, || self.unload_locked(name, true));
            }
        }
    }

    fn require_explicit(&self) -> Result<(), Error> {
        match self.options.mode {
            ControlMode::Explicit => Ok(()),
            ControlMode::None | ControlMode::Poll => Err(Error::Unavailable(NOT_EXPLICIT.into())),
        }
    }

    /// Model names in the stores, each with the first store that holds it.
    fn list(&self) -> BTreeMap<String, usize> {
        let mut names = BTreeMap::new();
        for (index, store) in self.stores.iter().enumerate() {
            match store.list() {
                Ok(listed) => {
                    for name in listed {
                        if let Some(first) = names.get(&name) {
                            if *first != index {
                                warn!(model = %name, "model name appears in more than one repository; keeping the first");
                            }
                            continue;
                        }
                        names.insert(name, index);
                    }
                }
                Err(e) => {
                    warn!(repository = %store.location(), "cannot read model repository: {e}")
                }
            }
        }
        names
    }

    fn load_from_store(&self, name: &str, keep_unchanged: bool) -> Result<(), Error> {
        self.with_model_lock(name, || self.load_locked(name, None, keep_unchanged))
            .inspect_err(|e| warn!(model = %name, "{}", e.message()))
    }

    /// Loads `name` from the first store holding it. The caller holds the model's lock.
    fn load_locked(
        &self,
        name: &str,
        config: Option<ModelConfig>,
        keep_unchanged: bool,
    ) -> Result<(), Error> {
        let Some(store) = self.stores.iter().find(|s| s.contains(name)) else {
            let reason = "model not found in any model repository".to_string();
            self.update(name, |old| {
                old.map(|slot| Slot {
                    status: slot.serving.as_ref().map_or_else(
                        || Status::Failed(LoadFailure::Model(reason.clone())),
                        |_| Status::Ready,
                    ),
                    ..slot.clone()
                })
            });
            return Err(Error::Internal(format!(
                "failed to load '{name}', failed to poll from model repository"
            )));
        };
        let fingerprint = store.fingerprint(name).ok();
        let dir = match store.fetch(name) {
            Ok(dir) => dir,
            Err(reason) => {
                return self.commit(name, Err(LoadFailure::Model(reason)), fingerprint, false)
            }
        };
        let source = Source {
            dir,
            fingerprint,
            from_override: false,
        };
        self.build_and_commit(name, source, config, keep_unchanged)
    }

    /// Prepares and builds the model beside what serves, then swaps it in. The caller holds the
    /// model's lock.
    fn build_and_commit(
        &self,
        name: &str,
        source: Source,
        config: Option<ModelConfig>,
        keep_unchanged: bool,
    ) -> Result<(), Error> {
        self.set_loading(name, Vec::new());
        info!(model = %name, "loading");
        let prepared = match loader::prepare(name, &source.dir, config, &self.options.load) {
            Ok(prepared) => prepared,
            Err(reason) => {
                let failure = Err(LoadFailure::Model(reason));
                return self.commit(name, failure, source.fingerprint, source.from_override);
            }
        };
        self.set_loading(name, prepared.versions.clone());
        let previous = self.snapshot().get(name).cloned();
        let old_model = previous.as_ref().and_then(|s| s.serving.clone());
        let old_files = previous.and_then(|s| s.loaded);
        let new_files = source.fingerprint.clone();
        let unchanged = |version: i64| {
            let key = version.to_string();
            match (&old_files, &new_files) {
                (Some(old), Some(new)) => {
                    old.shared == new.shared && old.versions.get(&key) == new.versions.get(&key)
                }
                _ => false,
            }
        };
        let reuse = old_model
            .as_deref()
            .filter(|_| keep_unchanged)
            .map(|model| (model, &unchanged as &dyn Fn(i64) -> bool));
        let built = loader::build(prepared, reuse);
        self.commit(name, built, source.fingerprint, source.from_override)
    }

    /// Publishes the outcome of a load: the new model replaces the old one (whose versions not
    /// carried over are retired), or the failure is recorded and any old model keeps serving.
    fn commit(
        &self,
        name: &str,
        built: Result<Model, LoadFailure>,
        fingerprint: Option<Fingerprint>,
        from_override: bool,
    ) -> Result<(), Error> {
        match built {
            Ok(model) => {
                let model = Arc::new(model);
                let versions: Vec<i64> = model.versions.keys().copied().collect();
                let old = self.update(name, |_| {
                    Some(Slot {
                        serving: Some(Arc::clone(&model)),
                        status: Status::Ready,
                        expected: true,
                        loaded: fingerprint.clone(),
                        seen: fingerprint.clone(),
                        from_override,
                    })
                });
                if let Some(previous) = old.and_then(|s| s.serving) {
                    let replaced = previous
                        .versions
                        .values()
                        .filter(|v| !model.versions.values().any(|n| Arc::ptr_eq(n, v)))
                        .cloned();
                    self.retirer.retire(name, replaced);
                }
                info!(model = %name, ?versions, "successfully loaded '{name}'");
                Ok(())
            }
            Err(failure) => {
                let message = failure.message(name);
                self.update(name, |old| {
                    let mut slot = old.cloned().unwrap_or_else(|| Slot::new(false));
                    slot.seen = fingerprint.clone();
                    slot.status = if slot.serving.is_some() {
                        warn!(model = %name, "reload failed, the loaded versions keep serving: {message}");
                        Status::Ready
                    } else {
                        Status::Failed(failure.clone())
                    };
                    if slot.serving.is_none() {
                        slot.from_override = from_override;
                    }
                    Some(slot)
                });
                Err(Error::InvalidArgument(message))
            }
        }
    }

    /// Takes `name` out of service; `forget` also drops its slot (its directory is gone).
    fn unload_locked(&self, name: &str, forget: bool) {
        let old = self.update(name, |old| {
            let slot = old?;
            if forget {
                return None;
            }
            let status = match &slot.serving {
                Some(model) => Status::Unloaded {
                    versions: model.versions.keys().copied().collect(),
                },
                None => slot.status.clone(),
            };
            Some(Slot {
                serving: None,
                status,
                expected: false,
                ..slot.clone()
            })
        });
        if let Some(model) = old.and_then(|s| s.serving) {
            info!(model = %name, "unloading");
            self.retirer.retire(name, model.versions.values().cloned());
        }
    }

    fn set_loading(&self, name: &str, versions: Vec<i64>) {
        self.update(name, |old| {
            let mut slot = old.cloned().unwrap_or_else(|| Slot::new(false));
            slot.status = Status::Loading { versions };
            Some(slot)
        });
    }

    /// Runs `operation` holding `name`'s lock, so loads and unloads of one model never overlap.
    fn with_model_lock<T>(&self, name: &str, operation: impl FnOnce() -> T) -> T {
        let lock = {
            let mut locks = self.operations.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(locks.entry(name.to_string()).or_default())
        };
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        operation()
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

/// Where one load reads its files.
struct Source {
    dir: PathBuf,
    /// `None` for override files (never compared).
    fingerprint: Option<Fingerprint>,
    from_override: bool,
}
