//! The command line of `chime bench` and `chime soak`. `chime` hands its whole command line
//! to this binary (argv[0] set to "chime"), so the options before the subcommand are the
//! server's global ones: where the database is, the log, the secret keys.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use chime::biz_types::secrets::SecretArgs;
use chime::db::DbArgs;
use chime::logs::LogArgs;

#[derive(Debug, Parser)]
#[command(
    name = "chime",
    version,
    about = "chime's benchmark and soak test: real `chime serve` nodes (the `chime` binary beside this one) under load."
)]
pub struct Cli {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(subcommand)]
    pub command: Tool,
}

#[derive(Debug, Subcommand)]
pub enum Tool {
    /// Measure chime: create rate, burst delivery, steady lateness, backlog independence.
    Bench(Box<BenchArgs>),
    /// Run a mixed load (creates, timers, failures, replays) against real nodes for a
    /// while, then count what was delivered, duplicated and lost (lost must be 0).
    Soak(SoakArgs),
}

/// `chime bench`. The nodes it starts are `chime serve` processes that inherit this
/// process's environment, so any CHIME_* setting applies to them.
#[derive(Debug, Clone, Args, serde::Serialize)]
#[command(after_help = "Without DATABASE_URL, the bench starts a throwaway embedded PostgreSQL with the same \
    durable settings as `chime serve` and removes it at the end. With DATABASE_URL, use a scratch database: the \
    bench adds biz types named bench-* and leaves their tasks behind.\n\n\
    Example, the README's figures: chime bench --runs 3 --svg docs/bench.svg\n\
    Backlog independence:       chime bench --scenarios burst,steady,backlog --nodes 1\n\
    Flat cost with size:        chime bench --scenarios scale --nodes 1 (100M pending, 30 days of 1M finished)\n\
    100,000 cron timers:        CHIME_TIMER_WINDOW_SECS=120 chime bench --scenarios timers --nodes 1\n\
    Fairness (issue 34's sizes): chime bench --scenarios fairness --nodes 1 (10,000 biz types; a herd of 200,000 beside 300/s)")]
pub struct BenchArgs {
    /// Scenarios to run, in this order: create-single, create-batch, burst, steady, timers
    /// (cron timers beside steady, on the first node count; set CHIME_TIMER_WINDOW_SECS to
    /// change how far ahead the leader writes their occurrences), fairness (steady among
    /// --fairness-biz-types idle biz types, and beside a herd of --fairness-herd tasks of
    /// another, each against the same without them), backlog, scale (backlog and scale fill
    /// the table, then repeat burst and steady on it).
    #[arg(long, value_delimiter = ',', default_value = "create-single,create-batch,burst,steady")]
    pub scenarios: Vec<BenchScenario>,

    /// Node counts to run burst and steady with (each count on one database).
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub nodes: Vec<u32>,

    /// Times to run each scenario; the table shows the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,

    /// Tasks created one per request in create-single.
    #[arg(long, default_value_t = 30_000)]
    pub single_tasks: u32,

    /// Concurrent clients in create-single.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub single_clients: u32,

    /// Tasks created in batches of 1000 in create-batch (unkeyed, and as many keyed).
    #[arg(long, default_value_t = 200_000)]
    pub batch_tasks: u32,

    /// What batch creates ask the answer to hold for each task: `ids` (`"results": "ids"`)
    /// or `tasks` (the whole task, the API's default).
    #[arg(long, default_value = "ids", value_parser = ["ids", "tasks"])]
    pub batch_results: String,

    /// Concurrent clients in create-batch (and when creating the burst and steady tasks).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub batch_clients: u32,

    /// Tasks falling due at one instant in burst.
    #[arg(long, default_value_t = 50_000)]
    pub burst_tasks: u32,

    /// Tasks per second, spread evenly, in steady.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub steady_rate: u32,

    /// Seconds of steady load.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub steady_secs: u32,

    /// Future tasks written before backlog repeats burst and steady.
    #[arg(long, default_value_t = 10_000_000)]
    pub backlog_future: u64,

    /// Finished tasks written before backlog repeats burst and steady.
    #[arg(long, default_value_t = 5_000_000)]
    pub backlog_finished: u64,

    /// Cron timers in the timers scenario: four fifths every minute, one fifth daily.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    pub timers: u32,

    /// Seconds the timers scenario measures their occurrences (steady runs beside them).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u32).range(20..=3600))]
    pub timers_secs: u32,
    /// Biz types in the fairness scenario's crowded part, all but 10 of them idle (never
    /// given a task); steady runs among 10, then among this many.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(11..=1_000_000))]
    pub fairness_biz_types: u64,

    /// Tasks of one biz type written due at one instant in the fairness scenario's noisy
    /// neighbour part, a second into steady (a quarter of --steady-secs if that is shorter).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub fairness_herd: u64,

    /// Which parts of the fairness scenario run (1: many biz types, 2: a herd beside steady,
    /// 3: priority, 4: flow keys), to measure one of them again without the others.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4", value_parser = clap::value_parser!(u8).range(1..=4))]
    pub fairness_parts: Vec<u8>,

    /// Seconds over which the fairness scenario counts the database's transactions at idle
    /// (with 10 biz types, then with --fairness-biz-types): long beside PostgreSQL's
    /// statistics flush lag (up to 10 s for an idle session).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub fairness_idle_secs: u32,

    /// Pending tasks written before scale repeats burst and steady, due evenly over the next
    /// year (nearly all of them in cold storage).
    #[arg(long, default_value_t = 100_000_000)]
    pub scale_pending: u64,

    /// Past days whose daily partitions scale writes finished tasks into (at most the
    /// retention, 30 days by default).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=366))]
    pub scale_days: u32,

    /// Finished tasks scale writes into each past day's partition.
    #[arg(long, default_value_t = 1_000_000)]
    pub scale_finished: u64,

    /// Bytes of each task's payload (a JSON object with a string of about this size).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(0..=65_000))]
    pub payload_bytes: u32,

    /// The bench biz types' max_in_flight (callbacks in flight at once, whole cluster).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_in_flight: u32,

    /// Send callbacks to this URL instead of the bench's own in-process receiver; figures
    /// then come from chime's attempt records (fire time) rather than arrival times.
    #[arg(long)]
    pub receiver_url: Option<String>,

    /// Where to write the results as JSON.
    #[arg(long, default_value = "chime-bench.json")]
    pub json: PathBuf,

    /// Also draw burst throughput over time and the steady lateness distribution as SVG.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "The load, through the nodes' APIs in turn: single creates at --rate per second, due \
    within 3 s, a third each of biz types soak-plain (the receiver answers 200), soak-flaky (503 the first time \
    every fourth task comes, so it is retried) and soak-replayed (422 the first time, so it fails at once and the soak \
    replays it); a batch of 100 plain tasks every second; --timers cron timers firing every second. At the end \
    the timers are deactivated and the soak waits for everything due to be delivered.\n\n\
    Lost: a task whose creation was acknowledged (or a timer's fire time before the end, whether or not its \
    occurrence was written) that the receiver never answered 2xx. The exit status is non-zero if any task is lost or any create fails.\n\n\
    Without DATABASE_URL, the soak starts a throwaway embedded PostgreSQL (the same durable settings as \
    `chime serve`) and removes it at the end. With DATABASE_URL, use a scratch database.\n\n\
    Example, an hour on two nodes: chime soak --secs 3600 --nodes 2\n\
    With a node killed every 30 s:  chime soak --secs 600 --nodes 2 --kill-every 30")]
pub struct SoakArgs {
    /// Seconds of load; the soak then waits up to 2 minutes for everything due.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=7 * 86_400))]
    pub secs: u32,

    /// Nodes (`chime serve` processes) on the database.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub nodes: u32,

    /// Single creates per second (besides a batch of 100 every second).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rate: u32,

    /// Cron timers, each firing every second.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub timers: u32,

    /// Every this many seconds of the load and the wait after it, kill one node with SIGKILL
    /// and start another in its place (0: never). Node 1 is spared and takes every API call,
    /// so it needs --nodes 2 or more.
    #[arg(long, default_value_t = 0)]
    pub kill_every: u32,

    /// Where to write the results as JSON.
    #[arg(long, default_value = "chime-soak.json")]
    pub json: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchScenario {
    CreateSingle,
    CreateBatch,
    Burst,
    Steady,
    Backlog,
    Timers,
    Fairness,
    Scale,
}
