//! One module per subcommand: its clap arguments and the glue that runs it.

pub mod cargo;
pub mod check;
pub mod demo;
pub mod devices;
pub mod diff;
pub mod lint;
pub mod profile;
pub mod report;
pub mod rules;

/// The exit status of a command that failed with `err`, after saying why on stderr: 2, or 0
/// for a closed pipe met by a command that gives no verdict (`perfkit report .. | head`). The
/// commands with a verdict (`lint`, `check`) write through [`PipeTolerant`] and keep it.
pub fn exit_on_error(err: &anyhow::Error) -> std::process::ExitCode {
    let broken_pipe = err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if broken_pipe {
        return std::process::ExitCode::SUCCESS;
    }
    crate::eprintln_lossy!("perfkit: error: {}", error_chain(err));
    std::process::ExitCode::from(2)
}

/// A writer that takes a closed pipe (`perfkit lint | head -1`) as the end of the reader's
/// interest, not as an error: what is written after it is dropped, and the command still ends
/// with the exit status of its verdict (a gate under `set -o pipefail` sees the findings' 1, not
/// the 0 of a command that stopped at the broken pipe). Other write errors (a full disk) stay
/// errors.
pub struct PipeTolerant<W> {
    inner: W,
    closed: bool,
}

impl<W> PipeTolerant<W> {
    pub fn new(inner: W) -> Self {
        PipeTolerant {
            inner,
            closed: false,
        }
    }
}

impl<W: std::io::Write> std::io::Write for PipeTolerant<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }
}

/// `err` and its causes, `: `-separated, each cause once: a message that already shows its
/// cause (`{path}: {source}` that also keeps the source) is not followed by it again.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    /// An error that shows its source in its own message and also keeps it as its source.
    #[derive(Debug)]
    struct Shown {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for Shown {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Shown {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_its_message_is_shown_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let text = io.to_string();
        let err = anyhow::Error::new(Shown {
            path: "run/trace".into(),
            source: io,
        })
        .context("cannot summarise the trace");
        let shown = error_chain(&err);
        assert_eq!(shown.matches(&text).count(), 1, "{shown}");
        assert!(
            shown.starts_with("cannot summarise the trace: run/trace: "),
            "{shown}"
        );
    }
}
