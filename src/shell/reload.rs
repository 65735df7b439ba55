//! The content-polling reloader: a value read from files ([`Reload`]) kept in step with them.
//!
//! It polls the *content* rather than watching paths: a Kubernetes Secret or ConfigMap volume
//! updates by an atomic rename of its `..data` symlink, which path watchers miss. Each check
//! reads the content and hashes it; content equal to what is served is left alone, new content
//! is parsed (off the async workers) and switched in only if it parses; otherwise the last good
//! value keeps being served and the problem is said once per distinct content.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

/// A value that can be replaced while it is read. Reads are lock-free.
#[derive(Default)]
pub struct Live<T>(ArcSwap<T>);

impl<T> Live<T> {
    /// Starts with `value`.
    pub fn new(value: T) -> Self {
        Self(ArcSwap::from_pointee(value))
    }

    /// Replaces the value.
    pub fn store(&self, value: T) {
        self.0.store(Arc::new(value));
    }

    /// The current value.
    pub fn load(&self) -> Arc<T> {
        self.0.load_full()
    }

    /// Reads the current value without taking a reference count.
    pub fn with<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.0.load())
    }
}

impl<T> fmt::Debug for Live<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value may hold key material: never printed.
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// What is reloaded: how to read and parse it (both run on a blocking thread), and what to say
/// (log, count) when it changed.
pub trait Reload: Send + Sync + 'static {
    /// What is served.
    type Value: Send + Sync + 'static;
    /// The content, as read.
    type Content: Send + 'static;
    /// Why the content cannot be read or served.
    type Error: Send + 'static;

    /// Reads the content, with a hash of it (equal hashes: the same content).
    ///
    /// # Errors
    /// When it cannot be read (e.g. a file missing during a non-atomic update).
    fn read(&self) -> Result<(u64, Self::Content), Self::Error>;

    /// Parses `content`.
    ///
    /// # Errors
    /// When it cannot be served.
    fn parse(&self, content: Self::Content) -> Result<Self::Value, Self::Error>;

    /// `value` is served from now on.
    fn reloaded(&self, value: &Self::Value);

    /// The content changed but cannot be served (`None`: reading it panicked); the last good
    /// value stays. Said once per distinct content.
    fn failed(&self, error: Option<Self::Error>);
}

/// Keeps a [`Live`] value in step with the content that `R` reads.
#[derive(Debug)]
pub struct Reloader<R: Reload> {
    source: Arc<R>,
    live: Arc<Live<R::Value>>,
    /// The hash of the content served (`None` before the first good load).
    served: Option<u64>,
    /// The hash of the content that failed last (0: it could not be read).
    failed: Option<u64>,
}

enum Change<R: Reload> {
    /// The content is what is served.
    Served,
    /// The content is what failed last.
    Failed,
    Loaded(u64, R::Value),
    Broken(u64, R::Error),
}

impl<R: Reload> Reloader<R> {
    /// A reloader into `live`, serving nothing from `source` until a [`check`](Self::check)
    /// loads it.
    pub fn new(source: R, live: Arc<Live<R::Value>>) -> Self {
        Self {
            source: Arc::new(source),
            live,
            served: None,
            failed: None,
        }
    }

    /// A reloader whose first load must succeed, serving it from the start. Blocking (a startup
    /// step).
    ///
    /// # Errors
    /// Why the content cannot be read or parsed.
    pub fn load(source: R) -> Result<Self, R::Error> {
        let (fingerprint, content) = source.read()?;
        let live = Arc::new(Live::new(source.parse(content)?));
        let mut reloader = Self::new(source, live);
        reloader.served = Some(fingerprint);
        Ok(reloader)
    }

    /// What is served.
    pub fn live(&self) -> Arc<Live<R::Value>> {
        Arc::clone(&self.live)
    }

    /// Reads the content once and switches to it if it changed and parses; says what happened
    /// through [`Reload::reloaded`] or [`Reload::failed`].
    pub async fn check(&mut self) {
        let (source, served, failed) = (Arc::clone(&self.source), self.served, self.failed);
        let change = tokio::task::spawn_blocking(move || match source.read() {
            Err(_) if failed == Some(0) => Change::Failed,
            Err(e) => Change::<R>::Broken(0, e),
            Ok((fingerprint, _)) if served == Some(fingerprint) => Change::Served,
            Ok((fingerprint, _)) if failed == Some(fingerprint) => Change::Failed,
            Ok((fingerprint, content)) => match source.parse(content) {
                Ok(value) => Change::Loaded(fingerprint, value),
                Err(e) => Change::Broken(fingerprint, e),
            },
        })
        .await;
        match change {
            // Back to what is served: the broken content, should it return, is news again.
            Ok(Change::Served) => self.failed = None,
            Ok(Change::Failed) => {}
            Ok(Change::Loaded(fingerprint, value)) => {
                self.live.store(value);
                (self.served, self.failed) = (Some(fingerprint), None);
                self.source.reloaded(&self.live.load());
            }
            Ok(Change::Broken(fingerprint, e)) => {
                self.failed = Some(fingerprint);
                self.source.failed(Some(e));
            }
            Err(_) => self.source.failed(None),
        }
    }

    /// Checks every `interval`, forever (the first check is one `interval` from now). Shared
    /// behind a lock so that a supervisor can restart the loop without losing what was seen.
    pub async fn poll(this: Arc<tokio::sync::Mutex<Self>>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            this.lock().await.check().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A source over a string in memory: `None` cannot be read, `"bad…"` does not parse.
    #[derive(Default)]
    struct Text {
        content: Mutex<Option<String>>,
        said: Mutex<Vec<String>>,
    }

    impl Text {
        fn set(&self, content: Option<&str>) {
            *self.content.lock().unwrap_or_else(|e| e.into_inner()) = content.map(str::to_string);
        }
        fn said(&self) -> Vec<String> {
            std::mem::take(&mut self.said.lock().unwrap_or_else(|e| e.into_inner()))
        }
        fn say(&self, what: String) {
            self.said
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(what);
        }
    }

    impl Reload for Arc<Text> {
        type Value = String;
        type Content = String;
        type Error = String;

        fn read(&self) -> Result<(u64, String), String> {
            use std::hash::{Hash, Hasher};
            let content = self.content.lock().unwrap_or_else(|e| e.into_inner());
            let content = content.clone().ok_or_else(|| "unreadable".to_string())?;
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            content.hash(&mut hasher);
            Ok((hasher.finish(), content))
        }

        fn parse(&self, content: String) -> Result<String, String> {
            if content.starts_with("bad") {
                Err(format!("cannot parse {content}"))
            } else {
                Ok(content)
            }
        }

        fn reloaded(&self, value: &String) {
            self.say(format!("reloaded {value}"));
        }

        fn failed(&self, error: Option<String>) {
            self.say(format!("failed: {}", error.unwrap_or_default()));
        }
    }

    #[tokio::test]
    async fn new_content_is_served_and_each_broken_content_said_once() {
        let text = Arc::new(Text::default());
        text.set(Some("one"));
        let mut reloader = Reloader::load(Arc::clone(&text)).expect("loads");
        let live = reloader.live();
        assert_eq!(*live.load(), "one");
        reloader.check().await;
        assert!(text.said().is_empty(), "the content served is left alone");

        text.set(Some("bad one"));
        reloader.check().await;
        reloader.check().await;
        assert_eq!(text.said(), ["failed: cannot parse bad one"]);
        assert_eq!(*live.load(), "one", "the last good value stays");

        // Unreadable (e.g. a file missing mid-update): said once too.
        text.set(None);
        reloader.check().await;
        reloader.check().await;
        assert_eq!(text.said(), ["failed: unreadable"]);

        // Back to what is served: nothing to say, and the broken content is news again.
        text.set(Some("one"));
        reloader.check().await;
        text.set(Some("bad one"));
        reloader.check().await;
        assert_eq!(text.said(), ["failed: cannot parse bad one"]);

        text.set(Some("two"));
        reloader.check().await;
        reloader.check().await;
        assert_eq!(text.said(), ["reloaded two"]);
        assert_eq!(*live.load(), "two");
    }

    #[tokio::test]
    async fn a_reloader_without_a_first_value_loads_at_its_first_good_check() {
        let text = Arc::new(Text::default());
        text.set(Some("bad"));
        let live = Arc::new(Live::new(String::new()));
        let mut reloader = Reloader::new(Arc::clone(&text), Arc::clone(&live));
        reloader.check().await;
        text.set(Some("good"));
        reloader.check().await;
        assert_eq!(*live.load(), "good");
        assert_eq!(text.said(), ["failed: cannot parse bad", "reloaded good"]);
    }

    #[tokio::test]
    async fn polling_checks_every_interval() {
        tokio::time::pause();
        let text = Arc::new(Text::default());
        text.set(Some("one"));
        let reloader = Reloader::load(Arc::clone(&text)).expect("loads");
        let live = reloader.live();
        let polling = tokio::spawn(Reloader::poll(
            Arc::new(tokio::sync::Mutex::new(reloader)),
            Duration::from_secs(2),
        ));
        text.set(Some("two"));
        for _ in 0..100 {
            if *live.load() == "two" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*live.load(), "two");
        polling.abort();
    }
}
