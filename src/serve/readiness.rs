//! Readiness of `serve`: what `/readyz` answers, set by the object source and the listener.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Readiness of `serve`: ready once the object source is loaded (or synced) and the TLS listener
/// is bound, until shutdown starts. Cheap to clone; any object source can drive it.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<ReadinessFlags>);

#[derive(Debug, Default)]
struct ReadinessFlags {
    objects: AtomicBool,
    listening: AtomicBool,
    draining: AtomicBool,
}

impl Readiness {
    /// Not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// The object source finished its first load (or initial sync).
    pub fn set_objects_loaded(&self) {
        self.0.objects.store(true, Ordering::Release);
    }

    /// The TLS listener is bound and accepting.
    pub fn set_listening(&self) {
        self.0.listening.store(true, Ordering::Release);
    }

    /// Shutdown started: report not ready so no new traffic is routed here.
    pub fn set_draining(&self) {
        self.0.draining.store(true, Ordering::Release);
    }

    /// `Ok` when ready, else what is missing.
    ///
    /// # Errors
    /// A short reason for the 503 body.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.0.draining.load(Ordering::Acquire) {
            Err("shutting down")
        } else if !self.0.objects.load(Ordering::Acquire) {
            Err("objects not loaded yet")
        } else if !self.0.listening.load(Ordering::Acquire) {
            Err("TLS listener not bound yet")
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_objects_and_listener() {
        let r = Readiness::new();
        assert!(r.check().is_err());
        r.set_objects_loaded();
        assert!(r.check().is_err());
        r.set_listening();
        assert_eq!(r.check(), Ok(()));
        r.set_draining();
        assert_eq!(r.check(), Err("shutting down"));
    }
}
