//! The controller's errors.

/// Why a controller operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A slice type does not make sense.
    #[error("TPU slice {field}: {reason}")]
    Slice {
        /// The setting, e.g. `topology`.
        field: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The kubeconfig could not be read or has no such context.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A call to the Kubernetes API server failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done, naming the object.
        what: String,
        /// The client's error (boxed: it is large, and errors travel in every `Result`).
        source: Box<kube::Error>,
    },
    /// The cluster does not have what the coordinator needs (no client Service, no ready pod).
    #[error("{0}")]
    NotFound(String),
    /// A port-forward could not be set up.
    #[error("port-forward: {0}")]
    PortForward(String),
}

impl Error {
    /// Wraps a client error with what was being done.
    pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source: Box::new(source) }
    }
}
