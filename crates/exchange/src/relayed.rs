//! Errors that crossed the network keep their original text.
//!
//! A stage that fails on a worker fails its query everywhere: its exchange streams end
//! with the error, and the coordinator is told. What the client reads is the error that
//! happened, as DataFusion words it ("Arrow error: Divide by zero error"), and apart
//! from it where it happened ("stage 0 on worker 1"), not a chain of the nodes it
//! passed. Between nodes the two travel as one string, [`RelayedError::wire`].

use datafusion::common::DataFusionError;
use gyre_transport::TransportError;

/// Separates an error's text from its place in [`RelayedError::wire`].
const SEPARATOR: char = '\u{1f}';

/// An error raised on another node or task and relayed here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedError {
    pub message: String,
    /// Where it happened; empty when not known.
    pub place: String,
}

impl std::fmt::Display for RelayedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.place.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{} ({})", self.message, self.place)
        }
    }
}

impl std::error::Error for RelayedError {}

impl RelayedError {
    /// The one-string form that travels between nodes.
    pub fn wire(&self) -> String {
        format!("{}{SEPARATOR}{}", self.message, self.place)
    }

    /// Reads [`RelayedError::wire`]; any other text is a message without a place.
    pub fn from_wire(text: &str) -> Self {
        match text.rsplit_once(SEPARATOR) {
            Some((message, place)) => Self {
                message: message.to_string(),
                place: place.to_string(),
            },
            None => Self {
                message: text.to_string(),
                place: String::new(),
            },
        }
    }

    /// As a DataFusion error (displayed as [`RelayedError`] is).
    pub fn into_datafusion(self) -> DataFusionError {
        DataFusionError::External(Box::new(self))
    }

    /// The relayed error somewhere in `e`'s chain of causes, if any.
    pub fn find(e: &DataFusionError) -> Option<Self> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(r) = c.downcast_ref::<RelayedError>() {
                return Some(r.clone());
            }
            if let Some(TransportError::Remote { message, .. }) = c.downcast_ref::<TransportError>()
            {
                return Some(Self::from_wire(message));
            }
            cause = c.source();
        }
        None
    }

    /// `e` as raised at `place`: a relayed error keeps its own text and place.
    pub fn at(e: &DataFusionError, place: &str) -> Self {
        Self::find(e).unwrap_or_else(|| Self {
            message: e.to_string(),
            place: place.to_string(),
        })
    }
}

/// The text of `e` for a person, without where it happened: a relayed error's own
/// text (without the wrappers it gathered on the way), any other as DataFusion shows it.
pub fn error_text(e: &DataFusionError) -> String {
    RelayedError::find(e).map_or_else(|| e.to_string(), |r| r.message)
}

/// Where `e` happened, if it was relayed from there.
pub fn error_place(e: &DataFusionError) -> Option<String> {
    RelayedError::find(e)
        .map(|r| r.place)
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_text_and_place_survive_relays() {
        let e = DataFusionError::ArrowError(Box::new(arrow::error::ArrowError::DivideByZero), None);
        let first = RelayedError::at(&e, "stage 0 on worker 1");
        assert_eq!(first.message, "Arrow error: Divide by zero error");
        assert_eq!(
            first.to_string(),
            "Arrow error: Divide by zero error (stage 0 on worker 1)"
        );
        // Through a stream to a peer, then to the coordinator: unchanged.
        let remote = DataFusionError::External(Box::new(TransportError::Remote {
            peer: 1,
            message: first.wire(),
        }));
        assert_eq!(RelayedError::at(&remote, "stage 2 on worker 3"), first);
        let relayed = first.clone().into_datafusion();
        let wrapped = DataFusionError::Context("while reading".into(), Box::new(relayed));
        assert_eq!(error_text(&wrapped), "Arrow error: Divide by zero error");
        assert_eq!(
            error_place(&wrapped).as_deref(),
            Some("stage 0 on worker 1")
        );
        // Errors raised here show as DataFusion shows them.
        let plan = DataFusionError::Plan("no such table".into());
        assert_eq!(error_text(&plan), "Error during planning: no such table");
        assert_eq!(error_place(&plan), None);
        assert_eq!(RelayedError::from_wire("plain").message, "plain");
    }
}
