//! `kiln`: a Triton-compatible (KServe v2) inference server for ONNX models.

use clap::Parser;
use kiln::cli::{Args, Bind, Launch};
use kiln::idle_poll::IdlePoll;
use kiln::logging;
use kiln::server::{self, Listeners};
use std::process::ExitCode;
use std::time::Duration;
use tracing::{error, info, warn};

/// Binds `bind.address`; with `reuse_port`, SO_REUSEPORT lets other processes bind it too.
fn bind(bind: Bind, what: &str) -> Option<tokio::net::TcpListener> {
    let socket = || -> std::io::Result<tokio::net::TcpListener> {
        let socket = if bind.address.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        if bind.reuse_port {
            socket.set_reuseport(true)?;
        }
        socket.bind(bind.address)?;
        socket.listen(1024)
    };
    match socket() {
        Ok(listener) => Some(listener),
        Err(e) => {
            error!("cannot bind {what} address {}: {e}", bind.address);
            None
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            error!("cannot listen for SIGTERM: {e}");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => info!("received Ctrl-C"),
        _ = term.recv() => info!("received SIGTERM"),
    }
}

/// Blocking work still running once the server has stopped (a model load stuck in ONNX Runtime,
/// say) gets this long before the process exits anyway.
const BLOCKING_GRACE: Duration = Duration::from_secs(2);

/// One idle poller per CPU the process may use (affinity and CPU quota considered), when
/// `--idle-poll-us` is not 0.
fn start_idle_poll(window_us: u64) -> std::io::Result<Option<IdlePoll>> {
    if window_us == 0 {
        return Ok(None);
    }
    if let Some(ns) = kiln::idle_poll::kernel_halt_poll_ns() {
        warn!(
            "the kernel already polls idle CPUs for {} µs before halting them (cpuidle haltpoll, \
             guest_halt_poll_ns); --idle-poll-us only adds cost on top of that, consider leaving \
             it off",
            ns / 1000
        );
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    info!(
        "idle polling: {threads} threads keep idle CPUs polling for {window_us} µs after activity"
    );
    IdlePoll::start(Duration::from_micros(window_us), threads).map(Some)
}

/// Makes the process dumpable or not: not, its `/proc/<pid>/environ`, `mem` and `maps` are
/// readable (and it can be traced) only with `CAP_SYS_PTRACE`, not by every process of its user,
/// Python models included (their stubs have no capabilities).
fn set_dumpable(dumpable: bool) {
    // SAFETY: a plain system call with constant arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            libc::c_ulong::from(dumpable),
            0,
            0,
            0,
        )
    } != 0
    {
        eprintln!(
            "cannot set the process dumpable={dumpable}: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() -> ExitCode {
    // First: the environment holds the secrets (object-store credentials, the bearer token).
    set_dumpable(false);
    let args = Args::parse();
    if args.allow_ptrace {
        set_dumpable(true);
    }
    let log = args.log_settings();
    if let Err(e) = logging::init(&log) {
        eprintln!("cannot open the log file {}: {e}", log.file);
        return ExitCode::FAILURE;
    }
    let launch = match args.launch() {
        Ok(launch) => launch,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    for note in &launch.notes {
        warn!("{note}");
    }
    if let Err(e) = kiln::protocol::limits::raise_file_limit() {
        warn!("cannot raise the open-file limit: {e}");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // Kept until the process exits.
    let _idle_poll = match start_idle_poll(launch.idle_poll_us) {
        Ok(Some(poll)) => {
            let activity = poll.activity();
            builder.on_thread_unpark(move || activity.mark());
            Some(poll)
        }
        Ok(None) => None,
        Err(e) => {
            error!("cannot start idle polling: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(e) => {
            error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(serve(launch));
    // Dropping the runtime would wait for every blocking task, however long it takes.
    runtime.shutdown_timeout(BLOCKING_GRACE);
    kiln::backend::python::environment::remove_unpacked();
    code
}

async fn serve(launch: Launch) -> ExitCode {
    let mut listeners = Listeners {
        grpc: None,
        http: None,
        metrics: None,
        sagemaker: None,
        vertex: None,
        openai: None,
    };
    for (bind_to, slot, what) in [
        (launch.grpc, &mut listeners.grpc, "gRPC"),
        (launch.http, &mut listeners.http, "HTTP"),
        (launch.metrics, &mut listeners.metrics, "metrics"),
        (launch.sagemaker, &mut listeners.sagemaker, "SageMaker"),
        (launch.vertex, &mut listeners.vertex, "Vertex AI"),
        (launch.openai, &mut listeners.openai, "OpenAI"),
    ] {
        if let Some(bind_to) = bind_to {
            match bind(bind_to, what) {
                Some(listener) => *slot = Some(listener),
                None => return ExitCode::FAILURE,
            }
        }
    }
    match server::run(launch.config, listeners, shutdown_signal()).await {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
