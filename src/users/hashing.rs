//! Password hashing on a few threads of its own, in memory that goes back to the kernel.
//!
//! argon2 (chime's parameters: 19 MiB, two passes) needs its working memory for tens of
//! milliseconds per hash. Run on tokio's blocking pool, each sign-in took a fresh thread,
//! whose malloc arena kept the 19 MiB after the hash: 10 wrong passwords took a node from
//! 18 to 152 MB and 128 concurrent ones to 419 MB, and it never came back. Here `THREADS`
//! threads hash, one job at a time each, in memory mapped for them while jobs are waiting
//! and unmapped as soon as none is: a flood costs at most `THREADS` × 19 MiB, an idle node
//! holds none of it. Jobs wait in one queue; anonymous callers (sign-in) find at most
//! `QUEUE` ahead of them or are told `Busy` (the console answers 503), so that a flood is
//! answered at once rather than by minutes of queue, and a right password sent a moment
//! later finds room. The place is taken before the user is looked up: a flood's refused
//! sign-ins, looked up first, held the pool so that an admitted right password waited 7 s
//! for its session's insert. Signed-in callers (an admin setting a password) always queue.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use rand::RngCore;

/// Hashes at once: each takes a core and 19 MiB while it runs.
const THREADS: usize = 2;
/// Anonymous jobs that may wait: at about 50 ms a hash, two threads clear them in well
/// under a second.
const QUEUE: usize = 16;

/// Too many hashes are waiting; try again in a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

type Job = Box<dyn FnOnce(&mut Scratch) + Send>;

struct Hashers {
    jobs: Mutex<Sender<Job>>,
    /// Jobs sent and not yet taken by a thread.
    waiting: Arc<AtomicUsize>,
}

fn hashers() -> &'static Hashers {
    static HASHERS: OnceLock<Hashers> = OnceLock::new();
    HASHERS.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let waiting = Arc::new(AtomicUsize::new(0));
        for n in 0..THREADS {
            let (queue, waiting) = (queue.clone(), waiting.clone());
            std::thread::Builder::new()
                .name(format!("chime-argon2-{n}"))
                .spawn(move || work(&queue, &waiting))
                .expect("a thread for password hashing");
        }
        Hashers { jobs: Mutex::new(jobs), waiting }
    })
}

/// One hashing thread: takes jobs until the process ends, keeping its memory while more
/// are waiting and giving it back when none is. A second after its last job, it asks
/// malloc to give back what the burst freed (`trim`).
fn work(queue: &Mutex<Receiver<Job>>, waiting: &AtomicUsize) {
    let mut scratch = Scratch::default();
    let mut untrimmed = false;
    loop {
        // Before waiting for the queue's lock, which the other thread may hold until the
        // next job arrives.
        if waiting.load(Ordering::Relaxed) == 0 {
            scratch.release();
        }
        let job = {
            let queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
            let next = if untrimmed { queue.recv_timeout(TRIM_AFTER) } else { queue.recv().map_err(RecvTimeoutError::from) };
            match next {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    untrimmed = false;
                    trim();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        waiting.fetch_sub(1, Ordering::Relaxed);
        job(&mut scratch);
        untrimmed = true;
    }
}

/// How long after its last job a hashing thread trims malloc's free memory.
const TRIM_AFTER: Duration = Duration::from_secs(1);

/// Gives the memory malloc holds free back to the kernel. A sign-in flood is a burst of
/// connections, pages and queries besides the hashes, whose memory glibc keeps free in its
/// arenas once they end. Measured (tests/faults/console.rs, 1,000 concurrent sign-ins, a
/// debug build): 36 MiB above rest a minute later before this trim (and before the check
/// of `waiting` above, without which one thread kept its 19 MiB); 15-16 MiB with both.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the kernel; it takes malloc's locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A place in the hashing queue, taken before a sign-in looks its user up so that a flood
/// refused `Busy` costs the database nothing; given back if dropped unused.
pub struct Place(bool);

impl Place {
    /// `anonymous`: refused with `Busy` when `QUEUE` jobs are already waiting; others
    /// always queue.
    pub fn take(anonymous: bool) -> Result<Place, Busy> {
        let hashers = hashers();
        if hashers.waiting.fetch_add(1, Ordering::Relaxed) >= QUEUE && anonymous {
            hashers.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Busy);
        }
        Ok(Place(true))
    }

    /// Runs `f` on a hashing thread and returns what it returned (the thread gives the
    /// place back as it takes the job).
    async fn run<T: Send + 'static>(mut self, f: impl FnOnce(&mut Scratch) -> T + Send + 'static) -> T {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |scratch| {
            let _ = reply.send(f(scratch));
        });
        self.0 = false;
        hashers().jobs.lock().unwrap_or_else(PoisonError::into_inner).send(job).expect("the password hashing threads run for the process's life");
        answer.await.expect("the password hashing threads run for the process's life")
    }

    /// Whether `password` is the one `phc` was made from.
    pub async fn verify(self, password: String, phc: String) -> bool {
        self.run(move |scratch| verify_with(password.as_bytes(), &phc, scratch)).await
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.0 {
            hashers().waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A new password's PHC string (argon2id, chime's parameters, a random salt).
pub async fn hash(password: String) -> String {
    let place = Place::take(false).expect("signed-in callers always queue");
    place.run(move |scratch| hash_with(password.as_bytes(), scratch)).await
}

/// What argon2's `hash_password` makes, in `scratch` rather than a fresh allocation.
fn hash_with(password: &[u8], scratch: &mut Scratch) -> String {
    let params = Params::default();
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    Argon2::default()
        .hash_password_into_with_memory(password, &salt, &mut out, scratch.blocks(params.block_count()))
        .expect("argon2 with default parameters");
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    PasswordHash {
        algorithm: Algorithm::default().ident(),
        version: Some(Version::default().into()),
        params: ParamsString::try_from(&params).expect("default parameters"),
        salt: Some(salt.as_salt()),
        hash: Some(Output::new(&out).expect("32 bytes is a valid output")),
    }
    .to_string()
}

/// argon2's `verify_password`, in `scratch`. A hash that cannot be read matches nothing.
fn verify_with(password: &[u8], phc: &str, scratch: &mut Scratch) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else { return false };
    let (Ok(algorithm), Ok(params)) = (Algorithm::try_from(hash.algorithm), Params::try_from(&hash)) else { return false };
    let Ok(version) = hash.version.map_or(Ok(Version::default()), Version::try_from) else { return false };
    let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else { return false };
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else { return false };
    let mut out = vec![0u8; expected.len()];
    let blocks = params.block_count();
    Argon2::new(algorithm, version, params).hash_password_into_with_memory(password, salt, &mut out, scratch.blocks(blocks)).is_ok()
        // `Output`'s comparison takes the same time wherever the bytes differ.
        && Output::new(&out).is_ok_and(|out| out == expected)
}

/// argon2's working memory, mapped anonymously and unmapped on `release`: malloc would
/// keep a freed 19 MiB block (its threshold for mapping grows to the largest size freed).
#[derive(Default)]
pub(super) struct Scratch {
    mapped: Option<(NonNull<Block>, usize)>,
}

// The mapping belongs to the one thread that holds the `Scratch`.
unsafe impl Send for Scratch {}

impl Scratch {
    /// At least `count` blocks, zeroed when first mapped.
    fn blocks(&mut self, count: usize) -> &mut [Block] {
        if self.mapped.is_some_and(|(_, mapped)| mapped < count) {
            self.release();
        }
        let (ptr, len) = *self.mapped.get_or_insert_with(|| (map(count), count));
        // SAFETY: `ptr` is a private anonymous mapping of `len` blocks, read-write, page
        // aligned (Block needs 64), zero-filled (a valid Block), owned by `self` alone
        // until `release` unmaps it, which needs `&mut self` while this borrow lives.
        unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) }
    }

    /// Gives the memory back to the kernel.
    fn release(&mut self) {
        if let Some((ptr, len)) = self.mapped.take() {
            // SAFETY: the mapping made by `map` with this length, no longer borrowed.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len * size_of::<Block>()) };
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.release();
    }
}

fn map(count: usize) -> NonNull<Block> {
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            count * size_of::<Block>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(ptr != libc::MAP_FAILED, "cannot map {} MiB for password hashing: {}", count / 1024, std::io::Error::last_os_error());
    NonNull::new(ptr.cast()).expect("mmap returns no null mapping")
}

#[cfg(test)]
mod tests {
    use argon2::PasswordVerifier;

    use super::*;

    #[tokio::test]
    async fn hashes_are_argon2s_own_and_verify_both_ways() {
        let phc = hash("correct horse".into()).await;
        // What argon2's own verifier accepts (and what stored hashes made by it look like).
        assert!(Argon2::default().verify_password(b"correct horse", &PasswordHash::new(&phc).unwrap()).is_ok());
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        assert!(Place::take(true).unwrap().verify("correct horse".into(), phc.clone()).await);
        assert!(!Place::take(true).unwrap().verify("correct horsf".into(), phc).await);
        let salt = SaltString::encode_b64(&[7; 16]).unwrap();
        let theirs = argon2::password_hash::PasswordHasher::hash_password(&Argon2::default(), b"pw", &salt).unwrap();
        assert!(Place::take(true).unwrap().verify("pw".into(), theirs.to_string()).await);
        assert!(!Place::take(true).unwrap().verify("pw".into(), "not a hash".into()).await);
    }
}
