//! The process-wide Prometheus registry: every drover metric a process reports,
//! for a `/metrics` page to encode.
//!
//! Named queues ([`QueueBuilder::name`](crate::queue::QueueBuilder::name)) and
//! controllers report here unless given other metrics.

use std::sync::OnceLock;

use prometheus_client::registry::Registry;

use crate::queue::QueueMetrics;
#[cfg(feature = "_store")]
use crate::runner::RunnerFamilies;

struct Global {
    registry: Registry,
    queue: QueueMetrics,
    #[cfg(feature = "_store")]
    runner: RunnerFamilies,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let mut registry = Registry::default();
        let queue = QueueMetrics::new(&mut registry);
        Global {
            #[cfg(feature = "_store")]
            runner: RunnerFamilies::new(&mut registry),
            queue,
            registry,
        }
    })
}

/// The registry holding every metric of this process.
///
/// ```
/// use drover::queue::Queue;
///
/// let queue: Queue<String> = Queue::builder().name("pods").build();
/// queue.add("default/web".to_string());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, drover::metrics::registry())?;
/// assert!(text.contains(r#"workqueue_depth{name="pods"} 1"#));
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn registry() -> &'static Registry {
    &global().registry
}

pub(crate) fn queue() -> &'static QueueMetrics {
    &global().queue
}

#[cfg(feature = "_store")]
pub(crate) fn runner() -> &'static RunnerFamilies {
    &global().runner
}
