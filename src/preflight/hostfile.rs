//! The hostfile the launcher reads, in either syntax (Decision 5): Open MPI's `host slots=N` and
//! Hydra's `host:N`. The pre-flight only needs the host names; it never panics on any content.

/// The most of the hostfile the pre-flight reads: the webhook denies a hostfile over 1 MiB, so
/// anything longer is not ours, and memory stays bounded whatever is mounted there.
pub const MAX_HOSTFILE_BYTES: usize = 1 << 20;

/// The longest DNS name (RFC 1035, without the trailing dot).
const MAX_NAME_LEN: usize = 253;

/// Why a hostfile cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostfileError {
    #[error("the hostfile is larger than {MAX_HOSTFILE_BYTES} bytes")]
    TooLarge,
    #[error("the hostfile is not UTF-8 text")]
    NotText,
    #[error("the hostfile names no host")]
    NoHosts,
    #[error("hostfile line {line}: {host:?} is not a host name")]
    BadHost { line: usize, host: String },
}

/// The hosts of a hostfile, in order, each once. A line is `host`, `host slots=N ...` or
/// `host:N`; `#` starts a comment; blank lines are skipped. Slot counts are the launcher's
/// business and are not checked here.
pub fn hosts(bytes: &[u8]) -> Result<Vec<String>, HostfileError> {
    if bytes.len() > MAX_HOSTFILE_BYTES {
        return Err(HostfileError::TooLarge);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| HostfileError::NotText)?;
    let mut hosts: Vec<String> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        let Some(first) = line.split_whitespace().next() else {
            continue;
        };
        let host = first.split(':').next().unwrap_or("");
        if !is_host_name(host) {
            return Err(HostfileError::BadHost {
                line: idx + 1,
                host: first.chars().take(80).collect(),
            });
        }
        if !hosts.iter().any(|h| h == host) {
            hosts.push(host.to_string());
        }
    }
    if hosts.is_empty() {
        return Err(HostfileError::NoHosts);
    }
    Ok(hosts)
}

/// Letters, digits, `-` and `.`, no empty label, at most 253 characters: what a pod's DNS name
/// is made of (an IP address passes too).
fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn open_mpi_syntax() {
        let text = b"# the workers\npi-node-0-0.pi slots=2\npi-node-0-1.pi slots=2 max_slots=4\n\n";
        assert_eq!(
            hosts(text),
            Ok(vec![
                "pi-node-0-0.pi".to_string(),
                "pi-node-0-1.pi".to_string()
            ])
        );
    }

    #[test]
    fn hydra_syntax_with_the_launchers_bare_name() {
        let text = b"pi-node-0-0.pi:1\r\npi-node-0-1.pi:1  # second\r\npi-launcher-0-0:1\r\n";
        assert_eq!(
            hosts(text),
            Ok(vec![
                "pi-node-0-0.pi".to_string(),
                "pi-node-0-1.pi".to_string(),
                "pi-launcher-0-0".to_string()
            ])
        );
    }

    #[test]
    fn a_host_listed_twice_is_checked_once() {
        assert_eq!(
            hosts(b"a slots=1\nb\na:2\n"),
            Ok(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(hosts(b"# nothing\n\n"), Err(HostfileError::NoHosts));
        assert_eq!(hosts(b""), Err(HostfileError::NoHosts));
        assert_eq!(hosts(b"ok\n\xff\n"), Err(HostfileError::NotText));
        assert_eq!(
            hosts(b"ok slots=1\nbad/host slots=1\n"),
            Err(HostfileError::BadHost {
                line: 2,
                host: "bad/host".into()
            })
        );
        assert_eq!(
            hosts(b"a..b\n"),
            Err(HostfileError::BadHost {
                line: 1,
                host: "a..b".into()
            })
        );
        assert_eq!(
            hosts(&vec![b'a'; MAX_HOSTFILE_BYTES + 1]),
            Err(HostfileError::TooLarge)
        );
        assert_eq!(
            HostfileError::BadHost {
                line: 2,
                host: "bad/host".into()
            }
            .to_string(),
            "hostfile line 2: \"bad/host\" is not a host name"
        );
        assert_eq!(
            HostfileError::TooLarge.to_string(),
            "the hostfile is larger than 1048576 bytes"
        );
    }

    proptest! {
        /// No content makes it panic; whatever it accepts is a list of plain host names.
        #[test]
        fn any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(hs) = hosts(&bytes) {
                prop_assert!(!hs.is_empty());
                prop_assert!(hs.iter().all(|h| is_host_name(h)));
            }
        }

        #[test]
        fn any_text(text in "[a-z0-9.:# =\\-\\n\\t]{0,300}") {
            let _ = hosts(text.as_bytes());
        }
    }
}
