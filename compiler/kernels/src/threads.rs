//! The kernels' threads: a pool the matrix kernel, the intrinsics and
//! large elementwise nodes share their work on. The thread that calls
//! [`for_each`] works too, beside `threads() - 1` workers; each takes the
//! next task with one atomic step, and the job's lock is taken once per
//! job and thread (a contended lock may park the thread that waits).
//!
//! A decode step runs about fifty kernels with a little single-threaded
//! work between them. A pool whose workers sleep as soon as they are idle
//! (rayon's) pays a wake-up at every kernel: tens of microseconds on a
//! virtual machine, a tenth of a 1 MB product's time. Here a worker that
//! finishes keeps watching for the next job for [`WATCH`] (spinning
//! briefly, then yielding its core to any other thread that wants it) and
//! only then sleeps; so the kernels of one step find it awake, as
//! llama.cpp's and OpenMP's threads are.
//!
//! One job runs at a time. A call made while another thread's job runs,
//! or from inside a task, runs its tasks itself, in order: correct, and
//! never a wait on the pool.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle worker watches for a new job before it sleeps.
const WATCH: Duration = Duration::from_millis(2);

/// How long of that it spins without yielding its core.
const SPIN: Duration = Duration::from_micros(50);

/// A job's work, borrowed for as long as [`for_each`] runs.
#[derive(Clone, Copy)]
struct Work(*const (dyn Fn(usize) + Sync));

// SAFETY: the work is `Sync`, and [`for_each`] does not return (ending the
// borrow) until every task that reached it has finished.
unsafe impl Send for Work {}

/// The job being run, if any.
struct Job {
    /// Bumped for every job; workers watch [`Pool::posted`] for it.
    generation: u64,
    work: Option<Work>,
    tasks: usize,
    /// A task's panic, which the caller resumes.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

/// [`Pool::cursor`]'s value: a job's generation (its low 32 bits) above
/// the next task to hand out, so that a thread still holding an older
/// job's generation can never take a task of this one.
fn cursor(generation: u64, next: usize) -> u64 {
    (generation << 32) | next as u64
}

struct Pool {
    threads: usize,
    job: Mutex<Job>,
    /// The newest job's generation, read without the lock while watching.
    posted: AtomicU64,
    /// The current job's generation and next task ([`cursor`]).
    cursor: AtomicU64,
    /// Tasks of the current job not yet finished.
    unfinished: AtomicUsize,
    /// Workers asleep on [`Pool::wake`].
    sleepers: AtomicUsize,
    wake: Condvar,
    /// Held by the thread whose job runs.
    caller: Mutex<()>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

thread_local! {
    /// Whether this thread is running a task (or is a worker): a call
    /// from here runs inline.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Why the kernels' thread count cannot be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadsError {
    /// Zero threads were asked for.
    None,
    /// The pool already runs this many.
    Started(usize),
}

impl std::fmt::Display for ThreadsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ThreadsError::None => write!(f, "the kernels need at least one thread"),
            ThreadsError::Started(threads) => write!(f, "the kernels' threads already started at {threads}"),
        }
    }
}

impl std::error::Error for ThreadsError {}

/// Sets how many threads the kernels use (the caller's included), before
/// their first use; an error once the pool has started at another count.
pub fn set_threads(threads: usize) -> Result<(), ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::None);
    }
    let pool = POOL.get_or_init(|| Pool::start(threads));
    if pool.threads == threads {
        Ok(())
    } else {
        Err(ThreadsError::Started(pool.threads))
    }
}

/// The threads the kernels use: set by [`set_threads`], else one per core.
pub fn threads() -> usize {
    pool().threads
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool::start(std::thread::available_parallelism().map_or(1, usize::from)))
}

/// Runs `work(task)` for every task in `0..tasks`, on the pool's threads
/// and this one, in no particular order; returns when all have finished.
/// A task's panic is resumed here, after the others have finished.
pub fn for_each(tasks: usize, work: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    let inline = || (0..tasks).for_each(work);
    if tasks <= 1 || pool.threads == 1 || INSIDE.get() {
        return inline();
    }
    assert!(tasks < u32::MAX as usize, "a job's tasks are counted in 32 bits");
    let _caller = match pool.caller.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return inline(),
    };
    // SAFETY: only the lifetime is erased; the pointer is dropped from the
    // job below before this call returns, and no task starts after that.
    let erased: *const (dyn Fn(usize) + Sync) =
        unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(work) };
    let generation = {
        let mut job = pool.lock();
        job.generation += 1;
        job.work = Some(Work(erased));
        job.tasks = tasks;
        pool.cursor.store(cursor(job.generation, 0), Ordering::Release);
        pool.unfinished.store(tasks, Ordering::Release);
        pool.posted.store(job.generation, Ordering::Release);
        job.generation
    };
    if pool.sleepers.load(Ordering::Acquire) > 0 {
        pool.wake.notify_all();
    }
    INSIDE.set(true);
    pool.run_tasks(generation);
    // The workers' last tasks: spinning, then yielding to them should one
    // share this core.
    let start = Instant::now();
    while pool.unfinished.load(Ordering::Acquire) > 0 {
        if start.elapsed() > SPIN {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    INSIDE.set(false);
    let panic = {
        let mut job = pool.lock();
        job.work = None;
        job.panic.take()
    };
    if let Some(payload) = panic {
        panic::resume_unwind(payload);
    }
}

/// `work(task)` for every task in `0..tasks`, run as [`for_each`] runs
/// them, the results in task order.
pub fn map<R: Send + Sync>(tasks: usize, work: &(dyn Fn(usize) -> R + Sync)) -> Vec<R> {
    let results: Vec<OnceLock<R>> = (0..tasks).map(|_| OnceLock::new()).collect();
    for_each(tasks, &|task| {
        let _ = results[task].set(work(task));
    });
    results.into_iter().map(|result| result.into_inner().expect("every task ran")).collect()
}

impl Pool {
    fn start(threads: usize) -> Pool {
        let shared = Pool {
            threads,
            job: Mutex::new(Job { generation: 0, work: None, tasks: 0, panic: None }),
            posted: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            unfinished: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            caller: Mutex::new(()),
        };
        for index in 1..threads {
            std::thread::Builder::new()
                .name(format!("linnet-kernels-{index}"))
                .spawn(|| pool().serve())
                .expect("the operating system starts the kernels' threads");
        }
        shared
    }

    /// The job's lock; a panic never happens while it is held.
    fn lock(&self) -> MutexGuard<'_, Job> {
        self.job.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A worker's life: each new job's tasks, then watching for the next.
    fn serve(&self) {
        INSIDE.set(true);
        let mut seen = 0;
        loop {
            seen = self.next_job(seen);
            self.run_tasks(seen);
        }
    }

    /// Waits for a job newer than `seen` and returns its generation.
    fn next_job(&self, seen: u64) -> u64 {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let posted = self.posted.load(Ordering::Acquire);
            if posted != seen {
                return posted;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) {
                let idle = start.elapsed();
                if idle > WATCH {
                    break;
                }
                if idle > SPIN {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        let mut job = self.lock();
        self.sleepers.fetch_add(1, Ordering::AcqRel);
        while job.generation == seen {
            job = self.wake.wait(job).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::AcqRel);
        job.generation
    }

    /// Takes tasks of job `generation` until none is left.
    fn run_tasks(&self, generation: u64) {
        let (work, tasks) = {
            let job = self.lock();
            match job.work {
                Some(work) if job.generation == generation => (work, job.tasks),
                _ => return,
            }
        };
        let mut current = self.cursor.load(Ordering::Acquire);
        loop {
            let task = (current & u64::from(u32::MAX)) as usize;
            if current >> 32 != generation & u64::from(u32::MAX) || task >= tasks {
                return;
            }
            if let Err(moved) =
                self.cursor.compare_exchange_weak(current, current + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                current = moved;
                continue;
            }
            // SAFETY: task `task` of this generation was unfinished when
            // it was taken, so the caller of `for_each` is still waiting
            // and `work` (this generation's) is alive.
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| unsafe { (*work.0)(task) }));
            if let Err(payload) = outcome {
                self.lock().panic.get_or_insert(payload);
            }
            self.unfinished.fetch_sub(1, Ordering::AcqRel);
            current = self.cursor.load(Ordering::Acquire);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{for_each, map};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every task runs exactly once, from one caller or several at once
    /// (their jobs take turns or run inline), and nested calls run.
    #[test]
    fn every_task_runs_once() {
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for tasks in [0, 1, 2, 7, 100] {
                        let runs: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                        for_each(tasks, &|task| {
                            let inner = AtomicUsize::new(0);
                            for_each(3, &|_| {
                                inner.fetch_add(1, Ordering::Relaxed);
                            });
                            assert_eq!(inner.load(Ordering::Relaxed), 3);
                            runs[task].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(runs.iter().all(|count| count.load(Ordering::Relaxed) == 1), "{tasks} tasks");
                    }
                });
            }
        });
    }

    /// Results come back in task order.
    #[test]
    fn map_keeps_task_order() {
        assert_eq!(map(100, &|task| task * task), (0..100).map(|task| task * task).collect::<Vec<_>>());
    }

    /// A task's panic reaches the caller, after which the pool still works.
    #[test]
    fn a_panic_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| for_each(8, &|task| assert_ne!(task, 5, "task five fails")));
        assert!(caught.is_err());
        let count = AtomicUsize::new(0);
        for_each(8, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }
}
