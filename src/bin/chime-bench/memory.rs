//! The resident memory (RSS) of the nodes the bench starts, read from
//! `/proc/<pid>/status` (`VmRSS`): once, or sampled every 100 ms while a scenario runs to
//! find its peak. Also the CPU time they used (`/proc/<pid>/stat`), for the share of a core
//! a node takes while idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often `Sampler` reads the nodes' RSS.
const EVERY: Duration = Duration::from_millis(100);

/// A process's resident set in MiB, or `None` where `/proc` does not say (not Linux, or
/// the process is gone).
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The largest RSS of any of `pids` now, in MiB.
pub fn max_rss_mib(pids: &[u32]) -> Option<f64> {
    pids.iter().filter_map(|&p| rss_mib(p)).reduce(f64::max)
}

/// The CPU time (user and system) a process has used so far, in seconds, or `None` where
/// `/proc` does not say.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, field 2, is in parentheses and may hold spaces: count from after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a system setting.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_sec > 0).then(|| ticks / per_sec as f64)
}

/// The CPU time of all of `pids` so far, in seconds (those `/proc` says nothing of left out).
pub fn total_cpu_secs(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| cpu_secs(p)).sum()
}

/// Reads the RSS of some processes every `EVERY` until stopped; keeps the peak.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Option<f64>>,
}

impl Sampler {
    pub fn start(pids: Vec<u32>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak: Option<f64> = None;
            let mut tick = tokio::time::interval(EVERY);
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Some(now) = max_rss_mib(&pids) {
                    peak = Some(peak.map_or(now, |p| p.max(now)));
                }
            }
            peak
        });
        Sampler { stop, task }
    }

    /// Stops sampling; the largest RSS seen of any of the processes, in MiB.
    pub async fn peak(self) -> Option<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_set() {
        let mib = rss_mib(std::process::id()).expect("VmRSS of this process");
        assert!(mib > 1.0 && mib < 100_000.0, "{mib}");
        assert_eq!(rss_mib(u32::MAX), None);
    }

    #[test]
    fn this_process_uses_cpu_time() {
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0);
        }
        let secs = cpu_secs(std::process::id()).expect("CPU time of this process");
        assert!(secs > 0.0 && secs < 100_000.0, "{secs}");
        assert_eq!(cpu_secs(u32::MAX), None);
    }
}
