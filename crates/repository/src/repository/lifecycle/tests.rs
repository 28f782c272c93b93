//! The lifecycle's bookkeeping without ONNX Runtime: a store with no model files, and serving
//! models whose versions run a stand-in backend.

use super::*;
use crate::backend::{Backend, BackendError};
use crate::core::Tensor;
use crate::metrics::ModelStats;
use crate::repository::{Executor, IoSpec, LoadError, ServingVersion, StoreError};
use crate::scheduler::{BatchingConfig, Scheduler};
use std::time::{Duration, Instant};

/// A store at `.0` that lists the names `.1` but has no files: every load fails at fetch.
struct NamesOnly(&'static str, Vec<&'static str>);

impl ModelStore for NamesOnly {
    fn location(&self) -> String {
        self.0.into()
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        Ok(self.1.iter().map(|s| s.to_string()).collect())
    }
    fn contains(&self, name: &str) -> bool {
        self.1.contains(&name)
    }
    fn fetch(&self, _: &str) -> Result<std::path::PathBuf, StoreError> {
        Err(StoreError::NotFound("no files here".into()))
    }
    fn fingerprint(&self, _: &str) -> Result<Fingerprint, StoreError> {
        Ok(Fingerprint::default())
    }
}

struct Echo;

impl Backend for Echo {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        Ok(inputs.to_vec())
    }
}

fn repository(mode: ControlMode, names: Vec<&'static str>) -> ModelRepository {
    let options = RepositoryOptions {
        mode,
        load_threads: 1,
        ..RepositoryOptions::default()
    };
    ModelRepository::new(vec![Box::new(NamesOnly("names-only", names))], options).unwrap()
}

fn serving_model(name: &str, versions: &[i64]) -> Arc<Model> {
    let versions = versions
        .iter()
        .map(|&version| {
            let stats = Arc::new(ModelStats::new(name, version));
            let scheduler = Scheduler::start(
                "test",
                BatchingConfig::default(),
                vec![Box::new(Echo)],
                Arc::clone(&stats),
            );
            let io = IoSpec {
                max_batch_size: 0,
                inputs: Vec::new(),
                outputs: Vec::new(),
            };
            let serving = ServingVersion {
                version,
                io,
                executor: Executor::Batched(scheduler),
                stats,
                cache: false,
                sequences: None,
                tokenizer: None,
                chat: None,
            };
            (version, Arc::new(serving))
        })
        .collect();
    Arc::new(Model {
        name: name.to_string(),
        config: Arc::default(),
        versions,
        labels: BTreeMap::new(),
        fallback: None,
    })
}

fn serve(repository: &ModelRepository, name: &str, versions: &[i64]) {
    let model = serving_model(name, versions);
    repository.update(name, |_| {
        Some(Slot {
            serving: Some(model),
            status: Status::Ready,
            ..Slot::new(true)
        })
    });
}

fn rows(repository: &ModelRepository, ready_only: bool) -> Vec<(String, String, String, String)> {
    repository
        .index(ready_only)
        .into_iter()
        .map(|e| (e.name, e.version, e.state, e.reason))
        .collect()
}

fn row(name: &str, version: &str, state: &str, reason: &str) -> (String, String, String, String) {
    (name.into(), version.into(), state.into(), reason.into())
}

#[test]
fn the_api_answers_only_in_explicit_mode() {
    for mode in [ControlMode::None, ControlMode::Poll] {
        let repository = repository(mode, vec!["a"]);
        let expected = Error::Unavailable(NOT_EXPLICIT.into());
        assert_eq!(repository.load("a", BTreeMap::new()), Err(expected.clone()));
        assert_eq!(repository.unload("a", false), Err(expected));
    }
    let repository = repository(ControlMode::Explicit, vec!["a"]);
    assert!(matches!(
        repository.load("../a", BTreeMap::new()),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        repository.load("zz", BTreeMap::new()),
        Err(Error::Internal(
            "failed to load 'zz', failed to poll from model repository".into()
        ))
    );
    assert!(
        repository.snapshot().get("zz").is_none(),
        "no slot for unknown names"
    );
    let long = "m".repeat(crate::repository::store::MAX_MODEL_NAME_BYTES + 1);
    assert!(matches!(
        repository.load(&long, BTreeMap::new()),
        Err(Error::InvalidArgument(message)) if message.contains("longer than the 255")
    ));
}

#[test]
fn load_locks_of_names_made_up_by_clients_are_not_kept() {
    let repository = repository(ControlMode::Explicit, vec!["a"]);
    for n in 0..100 {
        let _ = repository.load(&format!("made-up-{n}"), BTreeMap::new());
        let _ = repository.unload(&format!("made-up-{n}"), false);
    }
    let _ = repository.load("a", BTreeMap::new());
    assert!(repository
        .operations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty());
}

#[test]
fn unloading_a_name_no_model_can_have_succeeds_and_keeps_nothing() {
    // Triton checks the names it loads only (core LoadUnloadModel); unloading a model it does not
    // have succeeds (qa/L0_input_validation, test_model_name_invalid_unload).
    let repository = repository(ControlMode::Explicit, vec!["a"]);
    let long = "m".repeat(1 << 16);
    for name in ["../etc", "..", "model/", " ..", "", " \t ", "a\\b", &long] {
        assert_eq!(repository.unload(name, false), Ok(()), "{name:?}");
        assert_eq!(repository.unload(name, true), Ok(()), "{name:?}");
        assert!(repository.snapshot().get(name).is_none(), "{name:?}");
    }
    assert!(repository
        .operations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty());
}

#[test]
fn failed_loads_are_indexed_with_their_reason_and_not_expected() {
    let repository = repository(ControlMode::Explicit, vec!["a", "b"]);
    assert_eq!(
        rows(&repository, false),
        vec![row("a", "", "", ""), row("b", "", "", "")]
    );
    let error = repository.load("a", BTreeMap::new()).unwrap_err();
    assert_eq!(
        error,
        Error::InvalidArgument("load failed for model 'a': no files here".into())
    );
    assert_eq!(
        rows(&repository, false),
        vec![
            row("a", "", "UNAVAILABLE", "no files here"),
            row("b", "", "", "")
        ]
    );
    assert!(rows(&repository, true).is_empty());
    repository.load_startup();
    assert!(
        repository.all_expected_ready(),
        "an API load that failed is not expected"
    );
}

#[test]
fn strict_readiness_waits_for_the_start_up_load_and_expected_models() {
    let repository = repository(ControlMode::None, vec!["a"]);
    assert!(!repository.started() && !repository.all_expected_ready());
    repository.load_startup();
    assert!(repository.started());
    assert!(
        !repository.all_expected_ready(),
        "'a' should load and failed"
    );
    serve(&repository, "a", &[1]);
    assert!(repository.all_expected_ready());
}

#[test]
fn index_states_for_every_stage() {
    let repository = repository(ControlMode::Explicit, vec!["loading", "versions", "failed"]);
    repository.set_loading("loading", Vec::new());
    repository.set_loading("versions", vec![1, 2]);
    let failure = LoadFailure::Versions(BTreeMap::from([(
        3,
        crate::repository::loader::VersionFailure::Failed(LoadError::Backend("bad".into())),
    )]));
    repository.update("failed", |_| {
        Some(Slot {
            status: Status::Failed(failure),
            ..Slot::new(false)
        })
    });
    serve(&repository, "uploaded", &[1, 4]);
    assert_eq!(
        rows(&repository, false),
        vec![
            row("failed", "3", "UNAVAILABLE", "bad"),
            row("loading", "", "LOADING", ""),
            row("uploaded", "1", "READY", ""),
            row("uploaded", "4", "READY", ""),
            row("versions", "1", "LOADING", ""),
            row("versions", "2", "LOADING", ""),
        ]
    );
    assert_eq!(rows(&repository, true).len(), 2);
}

#[test]
fn unloaded_versions_stop_once_their_last_request_is_done() {
    let repository = repository(ControlMode::Explicit, vec!["m"]);
    serve(&repository, "m", &[1]);
    let mut changes = repository.subscribe();
    changes.mark_unchanged();
    // A request in flight holds the version it resolved.
    let in_flight = Arc::clone(
        &repository.snapshot()["m"]
            .serving
            .as_ref()
            .unwrap()
            .versions[&1],
    );
    repository.unload("m", false).unwrap();
    assert!(repository.snapshot()["m"].serving.is_none());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        rows(&repository, false),
        vec![row("m", "1", "UNLOADING", "")]
    );
    drop(in_flight);
    let deadline = Instant::now() + Duration::from_secs(5);
    while rows(&repository, false) != vec![row("m", "1", "UNAVAILABLE", "unloaded")] {
        assert!(Instant::now() < deadline, "never unloaded");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(changes.has_changed().unwrap());
    assert!(!repository.snapshot()["m"].expected);
}

/// Counts fetches, and fails them all.
struct Flaky {
    names: Vec<&'static str>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ModelStore for Flaky {
    fn location(&self) -> String {
        "flaky".into()
    }
    fn list(&self) -> std::io::Result<Vec<String>> {
        Ok(self.names.iter().map(|s| s.to_string()).collect())
    }
    fn contains(&self, name: &str) -> bool {
        self.names.contains(&name)
    }
    fn fetch(&self, _: &str) -> Result<std::path::PathBuf, StoreError> {
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(StoreError::Unavailable("store unavailable".into()))
    }
    fn fingerprint(&self, _: &str) -> Result<Fingerprint, StoreError> {
        Ok(Fingerprint::default())
    }
}

#[test]
fn start_up_loads_run_in_parallel_retry_failures_and_return_them_in_order() {
    let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = Flaky {
        names: vec!["c", "a", "b", "d", "e"],
        fetches: std::sync::Arc::clone(&fetches),
    };
    let options = RepositoryOptions {
        load_threads: 3,
        load_retries: 2,
        ..RepositoryOptions::default()
    };
    let repository = ModelRepository::new(vec![Box::new(store)], options).unwrap();
    let failures = repository.load_startup();
    // Each model is tried three times (once, then two retries), and reported once.
    assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 15);
    assert_eq!(failures.len(), 5);
    for (failure, name) in failures.iter().zip(["a", "b", "c", "d", "e"]) {
        assert!(
            failure.contains(&format!("'{name}'")) && failure.contains("store unavailable"),
            "{failure}"
        );
    }
    assert!(repository.started() && !repository.all_expected_ready());
}

#[test]
fn repositories_register_once_and_keep_names_unique() {
    let repository = repository(ControlMode::Explicit, vec!["a"]);
    repository
        .register_store(Arc::new(NamesOnly("/mme/1", vec!["b"])))
        .unwrap();
    let names = |r: &ModelRepository| r.list().into_keys().collect::<Vec<_>>();
    assert_eq!(names(&repository), ["a", "b"]);
    assert_eq!(
        repository.register_store(Arc::new(NamesOnly("/mme/1", vec!["c"]))),
        Err(Error::AlreadyExists(
            "model repository '/mme/1' has already been registered".into()
        ))
    );
    assert_eq!(
        repository.register_store(Arc::new(NamesOnly("/mme/2", vec!["c", "a"]))),
        Err(Error::AlreadyExists(
            "failed to register '/mme/2', there is a conflicting mapping for 'a'".into()
        ))
    );
    repository.unregister_store("/mme/1").unwrap();
    assert_eq!(names(&repository), ["a"]);
    assert_eq!(
        repository.unregister_store("/mme/1"),
        Err(Error::NotFound(
            "failed to unregister '/mme/1', repository not found".into()
        ))
    );
    // A failed load does not reach a store that was unregistered.
    assert_eq!(
        repository.load("b", BTreeMap::new()).unwrap_err(),
        Error::Internal("failed to load 'b', failed to poll from model repository".into())
    );
}

/// What the last load of `name`, which failed as a whole, failed on.
fn model_failure(repository: &ModelRepository, name: &str) -> LoadError {
    match &repository.snapshot()[name].status {
        Status::Failed(LoadFailure::Model(error)) => error.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn failed_loads_keep_where_they_failed() {
    // The store lists the name but cannot hand its files over: the store's answer, typed.
    let repository = repository(ControlMode::Explicit, vec!["a"]);
    let _ = repository.load("a", BTreeMap::new());
    assert_eq!(
        model_failure(&repository, "a"),
        LoadError::Store(StoreError::NotFound("no files here".into()))
    );
    let store = Flaky {
        names: vec!["f"],
        fetches: Default::default(),
    };
    let repository = ModelRepository::new(vec![Box::new(store)], RepositoryOptions::default());
    let repository = repository.unwrap();
    repository.load_startup();
    assert_eq!(
        model_failure(&repository, "f"),
        LoadError::Store(StoreError::Unavailable("store unavailable".into()))
    );
    // Start-up names that no store holds, or that no store could hold.
    let options = RepositoryOptions {
        mode: ControlMode::Explicit,
        startup_models: vec!["gone".into(), "../x".into()],
        load_threads: 1,
        ..RepositoryOptions::default()
    };
    let store = NamesOnly("names-only", Vec::new());
    let repository = ModelRepository::new(vec![Box::new(store)], options).unwrap();
    assert_eq!(
        repository.load_startup(),
        [
            "failed to load 'gone', failed to poll from model repository",
            "load failed for model '../x': invalid model name '../x', model name must not \
             contain path traversal characters",
        ]
    );
    let missing = "model not found in any model repository";
    assert_eq!(
        model_failure(&repository, "gone"),
        LoadError::Store(StoreError::NotFound(missing.into()))
    );
    assert!(matches!(
        model_failure(&repository, "../x"),
        LoadError::Store(StoreError::Invalid(_))
    ));
    assert_eq!(
        rows(&repository, false)[1],
        row("gone", "", "UNAVAILABLE", missing)
    );
}
