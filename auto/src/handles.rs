//! The raw handles of [`Auto`](crate::Auto): each carries the backend that made it, so every
//! operation on it reaches that backend.

use gpumem_core::host::{Host, HostEvent, HostGraph, HostStream};
use gpumem_core::{Backend, Error, Result};

/// A stream handle of the chosen backend: the [`Api::Stream`](gpumem_core::Api::Stream) of
/// [`Auto`](crate::Auto). Plain data, like the backends' own handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AutoStream {
    /// A host stream.
    Host(HostStream),
    /// A CUDA stream.
    #[cfg(feature = "cuda")]
    Cuda(gpumem_cuda::CudaStream),
    /// A HIP stream.
    #[cfg(feature = "hip")]
    Hip(gpumem_hip::HipStream),
}

/// An event of the chosen backend: the [`Api::Event`](gpumem_core::Api::Event) of
/// [`Auto`](crate::Auto), owned as the backend's own event is.
#[derive(Debug)]
pub enum AutoEvent {
    /// A host event.
    Host(std::sync::Arc<HostEvent>),
    /// A CUDA event.
    #[cfg(feature = "cuda")]
    Cuda(gpumem_cuda::CudaEvent),
    /// A HIP event.
    #[cfg(feature = "hip")]
    Hip(gpumem_hip::HipEvent),
}

/// An instantiated graph of the chosen backend: the [`Api::Graph`](gpumem_core::Api::Graph) of
/// [`Auto`](crate::Auto). None exists where the build's capabilities have no capture (see
/// [`Auto`](crate::Auto)'s `CAPS`).
#[derive(Debug)]
pub enum AutoGraph {
    /// A host graph.
    Host(HostGraph),
    /// A CUDA graph.
    #[cfg(feature = "cuda")]
    Cuda(gpumem_cuda::CudaGraph),
    /// A HIP graph (a type without values: HIP has no capture in gpumem).
    #[cfg(feature = "hip")]
    Hip(gpumem_hip::HipGraph),
}

/// The error for a handle of one backend passed while another is chosen. gpumem's typed layer
/// only passes handles `Auto` made, all on the one chosen backend, so only a handle forged
/// through the `unsafe` raw constructors can get here.
fn foreign_handle(kind: &str) -> Error {
    Error::InvalidArgument(format!("a {kind} of another backend than the one the auto backend chose"))
}

/// A backend `Auto` can choose: how its handles go into and out of `Auto`'s.
pub(crate) trait Member: Backend {
    fn wrap_stream(stream: Self::Stream) -> AutoStream;
    /// # Errors
    ///
    /// `InvalidArgument` for another backend's stream.
    fn stream(stream: AutoStream) -> Result<Self::Stream>;
    fn wrap_event(event: Self::Event) -> AutoEvent;
    /// # Errors
    ///
    /// `InvalidArgument` for another backend's event.
    fn event(event: &AutoEvent) -> Result<&Self::Event>;
    /// # Errors
    ///
    /// `InvalidArgument` for another backend's event (which is then dropped undestroyed).
    fn take_event(event: AutoEvent) -> Result<Self::Event>;
    fn wrap_graph(graph: Self::Graph) -> AutoGraph;
    /// # Errors
    ///
    /// `InvalidArgument` for another backend's graph.
    fn graph(graph: &AutoGraph) -> Result<&Self::Graph>;
    /// # Errors
    ///
    /// `InvalidArgument` for another backend's graph (which is then dropped undestroyed).
    fn take_graph(graph: AutoGraph) -> Result<Self::Graph>;
}

/// Implements [`Member`] for a backend whose handles are the variant `$variant` of each enum.
macro_rules! member {
    ($backend:ty, $variant:ident) => {
        // With only the host compiled in, each enum has one variant and `_` is unreachable.
        #[allow(unreachable_patterns)]
        impl Member for $backend {
            #[inline]
            fn wrap_stream(stream: Self::Stream) -> AutoStream {
                AutoStream::$variant(stream)
            }
            #[inline]
            fn stream(stream: AutoStream) -> Result<Self::Stream> {
                match stream {
                    AutoStream::$variant(s) => Ok(s),
                    _ => Err(foreign_handle("stream")),
                }
            }
            #[inline]
            fn wrap_event(event: Self::Event) -> AutoEvent {
                AutoEvent::$variant(event)
            }
            #[inline]
            fn event(event: &AutoEvent) -> Result<&Self::Event> {
                match event {
                    AutoEvent::$variant(e) => Ok(e),
                    _ => Err(foreign_handle("event")),
                }
            }
            #[inline]
            fn take_event(event: AutoEvent) -> Result<Self::Event> {
                match event {
                    AutoEvent::$variant(e) => Ok(e),
                    _ => Err(foreign_handle("event")),
                }
            }
            #[inline]
            fn wrap_graph(graph: Self::Graph) -> AutoGraph {
                AutoGraph::$variant(graph)
            }
            #[inline]
            fn graph(graph: &AutoGraph) -> Result<&Self::Graph> {
                match graph {
                    AutoGraph::$variant(g) => Ok(g),
                    _ => Err(foreign_handle("graph")),
                }
            }
            #[inline]
            fn take_graph(graph: AutoGraph) -> Result<Self::Graph> {
                match graph {
                    AutoGraph::$variant(g) => Ok(g),
                    _ => Err(foreign_handle("graph")),
                }
            }
        }
    };
}

member!(Host, Host);
#[cfg(feature = "cuda")]
member!(gpumem_cuda::Cuda, Cuda);
#[cfg(feature = "hip")]
member!(gpumem_hip::Hip, Hip);
