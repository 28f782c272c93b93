//! The operations that change models: the start-up load, the load and unload API, polling, and
//! the load pipeline they share (prepare and build beside what serves, then commit).

use super::{ControlMode, ModelRepository, Slot, Status};
use crate::core::Error;
use crate::core::LoadParameter;
use crate::proto::inference::ModelConfig;
use crate::repository::loader::{self, LoadError, LoadFailure};
use crate::repository::overrides::{self, OverrideDir};
use crate::repository::retire::trim_heap;
use crate::repository::store::{validate_name, Fingerprint, StoreError};
use crate::repository::{Executor, Model};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// How deep an ensemble's composing models are loaded with it (nested ensembles).
const ENSEMBLE_DEPTH: usize = 8;

impl ModelRepository {
    /// Loads what the control mode loads at start-up, `load_threads` models at a time; blocking.
    /// Failures are recorded per model, and returned as Triton's load messages.
    pub fn load_startup(&self) -> Vec<String> {
        let names: Vec<String> = match self.options.mode {
            ControlMode::Explicit if self.options.startup_models != ["*"] => {
                self.options.startup_models.clone()
            }
            // Requests load what they ask for.
            ControlMode::Poll if self.options.load_on_demand => Vec::new(),
            _ => self.list().into_keys().collect(),
        };
        self.update_all(|slots| {
            for name in &names {
                slots.insert(name.clone(), Slot::new(true));
            }
        });
        let failures = self.load_each(&names, false);
        self.started.store(true, Ordering::SeqCst);
        self.notify();
        info!(
            "start-up model loading finished: {} of {} models ready",
            names.len() - failures.len(),
            names.len()
        );
        failures
    }

    /// Loads `names` from the store, up to `load_threads` at once; returns the failures' messages
    /// in `names` order.
    fn load_each(&self, names: &[String], keep_unchanged: bool) -> Vec<String> {
        let next = AtomicUsize::new(0);
        let failures = Mutex::new(Vec::new());
        let worker = || {
            while let Some(name) = names.get(next.fetch_add(1, Ordering::Relaxed)) {
                if let Err(e) = self.load_from_store(name, keep_unchanged) {
                    failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((name, e.message().to_string()));
                }
            }
        };
        let threads = self.options.load_threads.clamp(1, names.len().max(1));
        if threads == 1 {
            worker();
        } else {
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(worker);
                }
            });
        }
        // What loading freed stays resident in the loading threads' malloc arenas unless handed
        // back: 35 of 114 MiB of anonymous memory after loading the peers' three models.
        trim_heap();
        let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
        failures.sort_by_key(|(name, _)| names.iter().position(|n| n == *name));
        failures.into_iter().map(|(_, message)| message).collect()
    }

    /// The load API: loads, or reloads, `name` with optional `config` / `file:` overrides.
    /// Blocking: run it off the async runtime.
    ///
    /// # Errors
    /// Triton's answers: UNAVAILABLE outside explicit mode, INVALID_ARGUMENT for a bad name or
    /// parameter or a failed load, INTERNAL for a model no store holds and for an override that
    /// cannot be read or written (Triton's poll failure).
    pub fn load(
        &self,
        name: &str,
        parameters: BTreeMap<String, LoadParameter>,
    ) -> Result<(), Error> {
        self.require_explicit()?;
        validate_name(name).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let overrides = overrides::parse(name, parameters)?;
        let loaded = self.load_with(name, overrides);
        trim_heap(); // as after load_each
        loaded
    }

    /// Whether a store holds model `name` (a name that may be one): what a request for a model
    /// that is not loaded may load (`--load-on-demand`). Asks each store in turn (a remote
    /// store's listing). Blocking.
    pub fn holds(&self, name: &str) -> bool {
        validate_name(name).is_ok() && self.stores().iter().any(|store| store.contains(name))
    }

    /// Loads `name` for a request that asked for it (`--load-on-demand`): as the load API loads it
    /// without parameters, with an ensemble's models. Blocking.
    ///
    /// # Errors
    /// As [`ModelRepository::load`].
    pub fn load_on_demand(&self, name: &str) -> Result<(), Error> {
        validate_name(name).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let loaded = self.load_with(name, overrides::Overrides::default());
        trim_heap();
        loaded
    }

    /// The load API's work: `name` from its store, or from the files sent with the request, then
    /// an ensemble's models that are not loaded yet.
    fn load_with(&self, name: &str, overrides: overrides::Overrides) -> Result<(), Error> {
        if overrides.files.is_empty() {
            self.retrying(name, || {
                self.with_model_lock(name, || {
                    self.load_locked(name, overrides.config.clone(), false)
                })
            })?;
        } else {
            let load = &self.options.load;
            if let Some(code) = overrides
                .code(&load.backend_directory)
                .filter(|_| !load.allow_code_in_overrides)
            {
                return Err(Error::InvalidArgument(format!(
                    "load of model '{name}' refused: {code}, and code sent with a load request \
                     would run as the server's user; start kiln with \
                     --allow-code-in-load-overrides to allow it"
                )));
            }
            // Triton writes the files while polling the model: a failure (a name longer than
            // the file system allows, a file where a directory must go) is its poll failure.
            let dir = OverrideDir::write(name, &overrides.files)
                .map_err(|e| overrides::poll_failure(name, e.message()))?;
            self.with_model_lock(name, || {
                let source = Source {
                    dir: dir.path().to_path_buf(),
                    fingerprint: None,
                    from_override: true,
                };
                self.build_and_commit(name, source, overrides.config, false)
            })?;
        }
        self.load_composing(name, 0)
    }

    /// An ensemble's models that are not loaded yet load with it, as in Triton (and theirs, for
    /// nested ensembles).
    fn load_composing(&self, name: &str, depth: usize) -> Result<(), Error> {
        if depth >= ENSEMBLE_DEPTH {
            return Ok(());
        }
        for composing in self.composing(name) {
            let serving = self
                .snapshot()
                .get(&composing)
                .is_some_and(|slot| slot.serving.is_some());
            if !serving {
                self.with_model_lock(&composing, || self.load_locked(&composing, None, false))
                    .map_err(|e| {
                        let message = format!(
                            "ensemble '{name}' needs model '{composing}': {}",
                            e.message()
                        );
                        e.with_message(message)
                    })?;
                self.load_composing(&composing, depth + 1)?;
            }
        }
        Ok(())
    }

    /// The models the latest version of ensemble `name` runs (none for other models).
    fn composing(&self, name: &str) -> Vec<String> {
        let snapshot = self.snapshot();
        let latest = snapshot
            .get(name)
            .and_then(|slot| slot.serving.as_ref())
            .and_then(|model| model.latest().cloned());
        match latest.as_deref().map(|serving| &serving.executor) {
            Some(Executor::Ensemble(plan)) => plan.models().into_iter().map(String::from).collect(),
            _ => Vec::new(),
        }
    }

    /// The unload API: the model stops serving at once; requests already running finish, then
    /// its sessions are freed (the index says UNLOADING until then). Unloading a model that is
    /// not loaded succeeds, as in Triton, whatever its name: Triton checks the names it loads
    /// only (core src/model_repository_manager/model_repository_manager.cc, `LoadUnloadModel`;
    /// qa/L0_input_validation `test_model_name_invalid_unload`), and unloading touches no file.
    /// With `dependents` (Triton's `unload_dependents`), an ensemble's models are unloaded too.
    ///
    /// # Errors
    /// UNAVAILABLE outside explicit mode.
    pub fn unload(&self, name: &str, dependents: bool) -> Result<(), Error> {
        self.require_explicit()?;
        let mut models = vec![name.to_string()];
        if dependents {
            // Every model the ensemble runs, however deep, each once.
            let mut next = 0;
            while next < models.len() {
                for composing in self.composing(&models[next]) {
                    if !models.contains(&composing) {
                        models.push(composing);
                    }
                }
                next += 1;
            }
        }
        for model in models {
            self.with_model_lock(&model, || {
                self.unload_locked(&model, false);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// One poll: loads new models, reloads changed ones (keeping versions whose files did not
    /// change), unloads models whose directory is gone. Blocking. With `--load-on-demand` it
    /// leaves models alone until a request has loaded them.
    pub fn poll(&self) {
        let listed = self.list();
        let mut changed = Vec::new();
        for (name, store) in &listed {
            let snapshot = self.snapshot();
            let loaded = snapshot
                .get(name)
                .is_some_and(|slot| slot.serving.is_some());
            if self.options.load_on_demand && !loaded {
                continue;
            }
            let fingerprint = store.fingerprint(name).ok();
            let differs = match snapshot.get(name) {
                None => {
                    info!(model = %name, "new model in the repository");
                    self.update(name, |_| Some(Slot::new(true)));
                    true
                }
                // A failed load records what it saw too: broken files are retried only once
                // they change again.
                Some(slot) => slot.seen != fingerprint,
            };
            if differs {
                changed.push(name.clone());
            }
        }
        self.load_each(&changed, true);
        for (name, slot) in self.snapshot().iter() {
            if !listed.contains_key(name) && !slot.from_override {
                info!(model = %name, "model directory removed from the repository");
                self.with_model_lock(name, || self.unload_locked(name, true));
            }
        }
    }

    fn load_from_store(&self, name: &str, keep_unchanged: bool) -> Result<(), Error> {
        self.retrying(name, || {
            self.with_model_lock(name, || self.load_locked(name, None, keep_unchanged))
        })
        .inspect_err(|e| warn!(model = %name, "{}", e.message()))
    }

    /// Runs `load` again after a failure, up to `load_retries` more times
    /// (`--model-load-retry-count`: a store that fails now and then).
    fn retrying(&self, name: &str, load: impl Fn() -> Result<(), Error>) -> Result<(), Error> {
        let mut attempt = 0;
        loop {
            match load() {
                Err(e) if attempt < self.options.load_retries => {
                    attempt += 1;
                    warn!(model = %name, "{}; trying again ({attempt} of {})", e.message(), self.options.load_retries);
                }
                result => return result,
            }
        }
    }

    /// Loads `name` from the first store holding it. The caller holds the model's lock.
    fn load_locked(
        &self,
        name: &str,
        config: Option<ModelConfig>,
        keep_unchanged: bool,
    ) -> Result<(), Error> {
        // A scanned directory's name (the load API's are checked before): refused with its reason.
        if let Err(reason) = validate_name(name) {
            return self.commit(name, Err(LoadFailure::Model(reason.into())), None, false);
        }
        let Some(store) = self.stores().into_iter().find(|s| s.contains(name)) else {
            let reason = LoadError::Store(StoreError::NotFound(
                "model not found in any model repository".into(),
            ));
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
                let failure = Err(LoadFailure::Model(reason.into()));
                return self.commit(name, failure, fingerprint, false);
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
                let previous = self.update(name, |old| {
                    let mut slot = old.cloned().unwrap_or_else(|| Slot::new(false));
                    slot.seen = fingerprint.clone();
                    if slot.serving.is_some() {
                        slot.status = Status::Ready;
                    } else {
                        slot.status = Status::Failed(failure.clone());
                        slot.from_override = from_override;
                    }
                    Some(slot)
                });
                if previous.is_some_and(|slot| slot.serving.is_some()) {
                    warn!(model = %name, "reload failed, the loaded versions keep serving");
                }
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

    pub(super) fn set_loading(&self, name: &str, versions: Vec<i64>) {
        self.update(name, |old| {
            let mut slot = old.cloned().unwrap_or_else(|| Slot::new(false));
            slot.status = Status::Loading { versions };
            Some(slot)
        });
    }
}

/// Where one load reads its files.
struct Source {
    dir: PathBuf,
    /// `None` for override files (never compared).
    fingerprint: Option<Fingerprint>,
    from_override: bool,
}
