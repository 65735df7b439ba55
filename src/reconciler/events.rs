//! The reconciler's one Event writer ([`Events`]): every Event it says on an owner goes through
//! here, by one of two ways.
//!
//! - [`Events::publish`]: kube's [`Recorder`], for what a reconcile finds wrong with an owner.
//!   A repeat within the Recorder's cache TTL becomes a PATCH of the first Event's `series`
//!   (count and last time), as client-go's recorder does.
//! - [`Events::create_once`]: a plain create under a name fixed by what happened, for a
//!   launcher Pod's failed pre-flight or launcher run (`<pod uid>.preflight-<run>`,
//!   `<pod uid>.launcher-<run>`). The Recorder cannot say these (kube-runtime 5.0): it names
//!   every Event `<regarding name>.<time in ns>`, with no way to choose, so a restarted or
//!   second replica seeing the same failed run would create a second Event, where the fixed
//!   name makes it `AlreadyExists`; and its series key (type, action, reason, reporter,
//!   regarding, related) leaves the note out, so a container's next failed run would be PATCHed
//!   into the first run's Event as a count, losing its own exit code and output.

use k8s_openapi::api::events::v1::Event;
use kube::api::PostParams;
use kube::runtime::events::{self, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};

/// Writes the reconciler's Events, as [`Reporter`] (the manager and this replica). Cheap to
/// clone.
#[derive(Clone)]
pub struct Events {
    client: Client,
    recorder: Recorder,
    reporter: Reporter,
}

impl Events {
    /// A writer through `client`, reported as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes an Event on `regarding` (the TrainJob, or in JobSet mode the JobSet) through
    /// the [`Recorder`], action `Reconcile`; a failure is logged, never returned (Events are
    /// best effort).
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        regarding: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = events::Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        if let Err(error) = self
            .recorder
            .publish(&event, &regarding.object_ref(&()))
            .await
        {
            tracing::warn!(%error, reason, "publishing an Event failed");
        }
    }

    /// Creates the Event that `make` builds from the reporter's controller and instance, in
    /// `namespace`, under the name it carries: `Ok(true)` when created here, `Ok(false)` when an
    /// Event of that name exists already (made before, here or by another replica).
    ///
    /// # Errors
    /// The API server's answer to the create, other than `AlreadyExists`.
    pub async fn create_once(
        &self,
        namespace: &str,
        make: impl FnOnce(&str, &str) -> Event,
    ) -> Result<bool, kube::Error> {
        let instance = self.reporter.instance.as_deref().unwrap_or_default();
        let event = make(&self.reporter.controller, instance);
        let api = Api::<Event>::namespaced(self.client.clone(), namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
            Err(error) => Err(error),
        }
    }
}
