//! What every request handler of a node shares, the REST API's and the console's alike:
//! the database, the node's phase, and the caches and limiters that live as long as the
//! node. Built once by `startup` and registered with the HTTP server.

use std::sync::Arc;

use crate::biz_types::{CreateLimiter, TokenCache};
use crate::callback_hosts::CallbackHosts;
use crate::db::{Health, Pool};
use crate::lifecycle::Signal;
use crate::pull::{PullLimits, Waiters};
use crate::tasks::CreateBatcher;
use crate::wake::{self, Wake};

pub struct AppState {
    pub pool: Pool,
    /// Whether the database is known to be down: API calls and `/readyz` then answer 503
    /// at once.
    pub health: Health,
    /// The largest payload a task or timer may carry (CHIME_MAX_PAYLOAD_BYTES).
    pub max_payload_bytes: usize,
    /// Which callback URLs biz types may be given (CHIME_DENY_PRIVATE_CALLBACKS).
    pub callback_hosts: CallbackHosts,
    /// Each biz type's create rate limit on this node.
    pub create_limiter: CreateLimiter,
    /// API tokens checked lately; emptied when any node changes a biz type.
    pub tokens: Arc<TokenCache>,
    /// Pull reserves waiting for a due task, in one line per biz type, woken by the
    /// wake-up notifications for their biz type.
    pub pull_waiters: Arc<Waiters>,
    /// This node's share of each pull biz type's rate.
    pub pull_limits: PullLimits,
    /// The biz types whose bulk operation runs on this node: one at a time each.
    pub bulk_running: crate::tasks::bulk::Running,
    /// The floor of unfinished work and the last minute's lateness, as the stats API read
    /// them lately.
    pub stats_floor: crate::tasks::stats::Floor,
    pub stats_lateness: crate::tasks::stats::LatenessCache,
    /// Single creates, written together when they arrive together.
    pub creates: CreateBatcher,
    /// The node's phase: `/readyz` answers 200 only while it is ready.
    pub lifecycle: Signal,
}

impl AppState {
    /// Must be called inside the runtime: it starts listening for wake-ups.
    pub fn new(pool: Pool, health: Health, max_payload_bytes: usize, callback_hosts: CallbackHosts, lifecycle: Signal) -> Self {
        let pull_waiters = Arc::new(Waiters::default());
        let waiters = pull_waiters.clone();
        let tokens = Arc::new(TokenCache::default());
        let cached = tokens.clone();
        // The LISTEN session breaks as soon as the server goes away: the first sign of it.
        let lost = health.clone();
        let on_wake = move |why: Wake| {
            // A biz type changed (perhaps archived): check tokens afresh.
            if why == Wake::Settings {
                cached.clear();
            }
            waiters.wake(why);
        };
        tokio::spawn(wake::listen(health.sessions(), on_wake, move || lost.mark_down()));
        AppState {
            creates: CreateBatcher::start(pool.clone()),
            pool,
            health,
            max_payload_bytes,
            callback_hosts,
            create_limiter: CreateLimiter::default(),
            tokens,
            pull_waiters,
            pull_limits: PullLimits::default(),
            bulk_running: Default::default(),
            stats_floor: Default::default(),
            stats_lateness: Default::default(),
            lifecycle,
        }
    }

    /// Forgets the API tokens this node has checked lately, so that the next use of each is
    /// checked again (after a biz type is archived; other nodes are told by notification).
    pub fn forget_tokens(&self) {
        self.tokens.clear();
    }
}
