//! One world: several workers (each the real `Controller`) over the model
//! store, a producer and an operator, faults and crashes, all on one thread
//! and one paused tokio clock, every choice drawn from one seed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::backoff::Backoff;
use drover::runner::Controller;
use drover::store::Retention;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::backend::{Cut, Shared, SimBackend};
use crate::log::{Event, Log, What};
use crate::model::{Model, PROCESS};
use crate::reconciler::SimReconciler;
use crate::rng::Rng;

/// Every worker's session TTL.
pub(crate) const TTL: Duration = Duration::from_secs(3);
/// The run timeout of the nodes that have one.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(2_500);
/// How long after the faults stop every key must have converged: a dead
/// session's expiry (TTL) and reclaim (TTL/2), a frozen call's end (4 s), the
/// longest backoff (3 s) and a few rounds of runs, with room to spare.
pub(crate) const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

/// What a world is made of, drawn from its seed.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub nodes: usize,
    pub keys: usize,
    pub chaos: Duration,
    pub fault_rate: f64,
    pub limit: Option<u32>,
    /// How much faster the database clock runs than the workers' (negative:
    /// slower), within [`DRIFT`] either way unless `DROVER_SIM_DRIFT` sets it.
    pub drift: f64,
    /// How long runs and idle keys are kept: seconds, so the pruner (every
    /// [`PRUNE_EVERY`]) removes some while keys come and go.
    pub retention: Retention,
}

/// How often a world's pruner runs a retention pass.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_millis(700);

/// The bound on the database clock's drift against the workers' clocks: 1 %,
/// twenty times what an NTP-disciplined host allows (500 ppm) and a tenth of
/// the safety margin a worker keeps (a tenth of its TTL). All workers share
/// tokio's clock, so the drift is the database's against all of them, which is
/// what a lease depends on: a worker never compares its clock with another's.
const DRIFT: f64 = 0.01;

impl Shape {
    fn draw(rng: &mut Rng) -> Self {
        Self {
            nodes: rng.between(2, 4) as usize,
            keys: rng.between(2, 10) as usize,
            chaos: rng.ms(3_000, 25_000),
            fault_rate: *rng.pick(&[0.0, 0.02, 0.05, 0.1, 0.2, 0.35]),
            limit: if rng.chance(0.4) {
                Some(rng.between(1, 3) as u32)
            } else {
                None
            },
            drift: crate::env_f64("DROVER_SIM_DRIFT")
                .unwrap_or_else(|| (rng.between(0, 2_000) as f64 / 1_000.0 - 1.0) * DRIFT),
            retention: Retention {
                keep_runs_for: rng.ms(500, 5_000),
                keep_runs_per_key: rng.between(1, 4) as u32,
                forget_idle_after: rng.chance(0.8).then(|| rng.ms(1, 3_000)),
            },
        }
    }
}

/// What a world left behind.
#[derive(Debug)]
pub(crate) struct Ran {
    pub shape: Shape,
    pub events: Vec<Event>,
    /// When the faults stopped.
    pub quiet_at: Duration,
    /// When every key had converged after that, if it did in time.
    pub converged_at: Option<Duration>,
    /// The model's items that had not converged at the end, if any.
    pub unconverged: Vec<String>,
}

/// Runs the world of `seed` to its end.
pub(crate) fn run(seed: u64) -> Ran {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(world(seed))
}

/// A node: the worker running on it now, if any.
struct Node {
    worker: u32,
    death: CancellationToken,
    task: Option<JoinHandle<()>>,
}

struct World {
    shared: Arc<Shared>,
    nodes: Vec<Node>,
    next_worker: u32,
    workers: Vec<WorkerShape>,
}

/// How a node's workers are configured.
#[derive(Debug, Clone, Copy)]
struct WorkerShape {
    parallelism: usize,
    prefetch: usize,
    timeout: Option<Duration>,
}

impl World {
    /// Starts a worker on node `i`: the real controller, restarted (as a
    /// supervisor would) if it ends with an error.
    fn start(&mut self, i: usize) {
        let worker = self.next_worker;
        self.next_worker += 1;
        let death = CancellationToken::new();
        let shared = Arc::clone(&self.shared);
        let shape = self.workers[i];
        shared.log.push(What::Start { worker });
        let d = death.clone();
        let task = tokio::spawn(async move {
            loop {
                let backend = SimBackend {
                    worker,
                    shared: Arc::clone(&shared),
                    death: d.clone(),
                };
                let reconciler = SimReconciler {
                    worker,
                    shared: Arc::clone(&shared),
                    death: d.clone(),
                    timeout: shape.timeout,
                };
                let mut builder = Controller::builder(backend, PROCESS, reconciler)
                    .parallelism(shape.parallelism)
                    .prefetch(shape.prefetch)
                    .ttl(TTL)
                    .idle_poll(Duration::from_millis(500));
                if let Some(timeout) = shape.timeout {
                    builder = builder.timeout(timeout);
                }
                let controller = builder.build().expect("valid settings");
                // Only the first session's start can fail the run.
                if controller.run(CancellationToken::new()).await.is_err() {
                    sleep(Duration::from_millis(200)).await;
                }
            }
        });
        self.nodes[i] = Node {
            worker,
            death,
            task: Some(task),
        };
    }

    /// Crashes node `i`'s worker: every task of it stops where it stands
    /// (its calls never answer, its runs stop), and its supervisor is gone.
    fn crash(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(task) = node.task.take() {
            self.shared.log.push(What::Crash {
                worker: node.worker,
            });
            node.death.cancel();
            task.abort();
        }
    }

    fn down(&self, i: usize) -> bool {
        self.nodes[i].task.is_none()
    }
}

async fn world(seed: u64) -> Ran {
    let mut rng = Rng::new(seed);
    let shape = Shape::draw(&mut rng);
    let log = Log::new(Instant::now());
    let backoff = Backoff::new(Duration::from_millis(200), 2.0, Duration::from_secs(3))
        .expect("a valid policy");
    let mut model = Model::new(log.clone(), backoff);
    model.set_drift(shape.drift);
    model.set_retention(shape.retention);
    if shape.limit.is_some() {
        model.set_limit(shape.limit);
    }
    let workers = (0..shape.nodes)
        .map(|_| WorkerShape {
            parallelism: rng.between(1, 3) as usize,
            prefetch: rng.between(0, 1) as usize,
            timeout: rng.chance(0.5).then_some(TIMEOUT),
        })
        .collect();
    let shared = Arc::new(Shared {
        log: log.clone(),
        model: Mutex::new(model),
        rng: Mutex::new(Rng::new(rng.next_u64())),
        fault_rate: shape.fault_rate,
        quiet: false.into(),
        cuts: Mutex::default(),
        write_outages: Mutex::default(),
    });
    let mut world = World {
        shared: Arc::clone(&shared),
        nodes: (0..shape.nodes)
            .map(|_| Node {
                worker: 0,
                death: CancellationToken::new(),
                task: None,
            })
            .collect(),
        next_worker: 1,
        workers,
    };
    for i in 0..shape.nodes {
        world.start(i);
    }
    // Retention, as any node's pruner applies it, all through the world.
    let pruner = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                sleep(PRUNE_EVERY).await;
                shared.model().retention_prune();
            }
        })
    };
    let keys: Vec<String> = (0..shape.keys).map(|k| format!("k{k}")).collect();
    let end_of_chaos = Instant::now() + shape.chaos;
    while Instant::now() < end_of_chaos {
        let wait = rng.ms(5, 400);
        sleep(wait).await;
        act(&mut world, &mut rng, &keys);
    }
    // Faults stop; every node comes back; the operator resumes the process.
    shared.quiet.store(true, Ordering::SeqCst);
    shared.cuts.lock().expect("not poisoned").clear();
    shared.write_outages.lock().expect("not poisoned").clear();
    log.push(What::Quiet);
    let quiet_at = log.now();
    for i in 0..shape.nodes {
        if world.down(i) {
            world.start(i);
        }
    }
    if shared.model().paused {
        shared.model().set_paused(false);
    }
    let give_up = Instant::now() + CONVERGE_WITHIN;
    let mut converged_at = None;
    while Instant::now() < give_up {
        sleep(Duration::from_millis(50)).await;
        if shared.model().converged() {
            converged_at = Some(log.now());
            break;
        }
    }
    let unconverged = shared
        .model()
        .items
        .iter()
        .filter(|(_, i)| {
            !matches!(
                i.state,
                crate::model::State::Idle | crate::model::State::Parked
            )
        })
        .map(|(k, i)| format!("{k}: {:?}", i.state))
        .collect();
    for i in 0..shape.nodes {
        world.crash(i);
    }
    pruner.abort();
    Ran {
        shape,
        events: log.events(),
        quiet_at,
        converged_at,
        unconverged,
    }
}

/// One action of the producer, the operator or fate.
fn act(world: &mut World, rng: &mut Rng, keys: &[String]) {
    let shared = Arc::clone(&world.shared);
    match rng.below(100) {
        0..=59 => {
            let key = rng.pick(keys);
            let after = if rng.chance(0.2) {
                rng.ms(1, 2_000)
            } else {
                Duration::ZERO
            };
            let priority = rng.between(0, 2) as i32;
            shared.model().enqueue(key, after, priority);
        }
        60..=69 => {
            for key in keys {
                if rng.chance(0.5) {
                    shared.model().enqueue(key, Duration::ZERO, 0);
                }
            }
        }
        70..=77 => {
            let i = rng.below(world.nodes.len() as u64) as usize;
            if world.down(i) {
                world.start(i);
            } else {
                world.crash(i);
            }
        }
        78..=80 => {
            let i = rng.below(world.nodes.len() as u64) as usize;
            let worker = world.nodes[i].worker;
            let slow = rng.ms(200, 990);
            let down = rng.ms(500, 6_000);
            let now = Instant::now();
            let cut = Cut {
                slow_until: now + slow,
                down_until: now + slow + down,
            };
            shared.log.push(What::Partition { worker, slow, down });
            shared
                .cuts
                .lock()
                .expect("not poisoned")
                .insert(worker, cut);
        }
        81..=83 => {
            let paused = shared.model().paused;
            shared.model().set_paused(!paused);
        }
        84 => {
            // Longer than a TTL at times: an outcome that cannot be written
            // within one is handed back, which this outage fails too.
            let i = rng.below(world.nodes.len() as u64) as usize;
            let worker = world.nodes[i].worker;
            let lasts = rng.ms(500, 3 * TTL.as_millis() as u64);
            shared.log.push(What::WriteOutage { worker, lasts });
            shared
                .write_outages
                .lock()
                .expect("not poisoned")
                .insert(worker, Instant::now() + lasts);
        }
        _ => {
            let action = *rng.pick(&["retry", "park", "delete"]);
            let key = rng.pick(keys);
            shared.model().admin(action, key);
        }
    }
}
