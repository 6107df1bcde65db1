//! The maintenance loops any node may run beside its controllers, apart from the
//! loop that runs keys: retention ([`Pruner`]) and resync ([`Resyncer`]), each on
//! a jittered timer so nodes started together spread their work out.
//!
//! They only call the store's operator seam ([`Store`](crate::store::Store));
//! every decision they apply (which runs are old enough, which idle keys are
//! due) is the store's, so any number of nodes may run them against one
//! database. `drover serve` and every [`Controller`](super::Controller) on a
//! database run both (how often: [`ControllerBuilder::prune_every`](super::ControllerBuilder::prune_every));
//! a library user may also run them on their own.

mod pacing;
mod pruner;
mod resyncer;
mod ticks;

pub use pruner::{Pruned, Pruner};
pub use resyncer::Resyncer;
