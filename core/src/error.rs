//! gpumem's one error type.
//!
//! The variants separate what a caller can act on: memory that ran out (retry smaller, free
//! caches), a runtime that is missing (fall back to another backend), bad input (a bug at the call
//! site), an operation refused while a stream captures, an operation this backend cannot do, and
//! everything the runtime itself reported.

use std::fmt;

/// The result type of every fallible gpumem operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An [`Error`] boxed to one word, for internal paths that return a chunk or an error: an
/// `Error` is many words, and a `Result` carrying one is moved whole at every return even when it
/// holds the chunk. `?` turns it back into the [`Error`] inside.
pub(crate) struct BoxedError(Box<Error>);

impl From<Error> for BoxedError {
    #[cold]
    fn from(error: Error) -> Self {
        BoxedError(Box::new(error))
    }
}

impl From<BoxedError> for Error {
    #[cold]
    fn from(boxed: BoxedError) -> Self {
        *boxed.0
    }
}

/// The error a hook returns to stop an operation.
pub type HookError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A hook's error as an [`Error`] keeps it: shared, so that [`Error`] is `Clone`.
pub type SharedHookError = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in gpumem.
///
/// `Debug` prints the variant's name and the message (`LimitExceeded: Out of memory allocating
/// ...`), so a `main` returning `Result<(), gpumem::Error>` reports what went wrong, not the
/// variant's fields.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An allocation could not be served: the device (or the pool, after releasing its cached
    /// blocks and retrying) ran out of memory. The message is CuPy's `OutOfMemoryError` text.
    #[error("{}", out_of_memory_message(*.size, *.total, 0))]
    OutOfMemory {
        /// The size asked for (rounded to the pool's unit on the pool's path).
        size: usize,
        /// Bytes held from the device so far, where known.
        total: Option<usize>,
    },

    /// An allocation would take the pool past its limit, even after releasing cached blocks.
    /// The message is CuPy's `OutOfMemoryError` text for a set limit.
    #[error("{}", out_of_memory_message(*.size, Some(*.total), *.limit))]
    LimitExceeded {
        /// The rounded size asked for.
        size: usize,
        /// Bytes the pool held from the device when it gave up.
        total: usize,
        /// The pool's limit in bytes.
        limit: usize,
    },

    /// The runtime library (libcuda, libamdhip64) could not be loaded.
    #[error("{backend} runtime library not found: {detail}")]
    DriverNotFound {
        /// The backend's name.
        backend: &'static str,
        /// What was tried, or the loader's message.
        detail: String,
    },

    /// The runtime is present but reports no usable device.
    #[error("no {backend} device is available")]
    NoDevice {
        /// The backend's name.
        backend: &'static str,
    },

    /// A copy, memset or offset reaches outside the memory it names. Nothing was done.
    #[error("{}", out_of_bounds_message(operation, *offset, *len, *size))]
    OutOfBounds {
        /// What was refused (`"memset"`, `"copy_from_device source"`, ...).
        operation: &'static str,
        /// The pointer's offset from the start of its memory (may be negative).
        offset: isize,
        /// The number of bytes the operation would touch.
        len: usize,
        /// The size of the memory.
        size: usize,
    },

    /// An argument is not valid (a flag combination, a size, a handle) and no more specific
    /// variant says why. Nothing was done.
    ///
    /// This includes a size no allocation can have: past [`MAX_ALLOCATION_SIZE`], or one that
    /// overflows when rounded to the pool's unit (`usize::MAX`). Unlike
    /// [`OutOfMemory`](Error::OutOfMemory), freeing memory and retrying cannot help, so an
    /// out-of-memory retry loop ([`Error::is_out_of_memory`]) stops at once.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The source and destination of a device copy overlap. Nothing was copied.
    #[error("copy of {} from 0x{src:x} to 0x{dst:x}: source and destination overlap", Bytes(*size))]
    Overlap {
        /// The source address.
        src: usize,
        /// The destination address.
        dst: usize,
        /// The byte count.
        size: usize,
    },

    /// A stream priority outside the device's range (lower numbers are higher priorities).
    #[error("stream priority {priority} is outside the device's range [{greatest}, {least}]")]
    PriorityOutOfRange {
        /// The priority asked for.
        priority: i32,
        /// The device's lowest priority (largest number).
        least: i32,
        /// The device's highest priority (smallest number).
        greatest: i32,
    },

    /// A device id that does not exist (negative, or not below the device count), given to the
    /// typed layer: [`Device`](crate::Device), the pools, the C ABI. The backends' raw functions
    /// answer as their runtime does (`CUDA_ERROR_INVALID_DEVICE`, `HOST_ERROR_INVALID_DEVICE`).
    #[error("device {device} does not exist ({count} device(s) on the {backend} backend)")]
    NoSuchDevice {
        /// The id asked for.
        device: i32,
        /// How many devices there are.
        count: usize,
        /// The backend's name.
        backend: &'static str,
    },

    /// Capture was asked of the null or legacy stream, which cannot capture (CuPy's message).
    #[error("cannot capture on the default (legacy) stream")]
    CaptureOnDefaultStream,

    /// An asynchronous copy was given pageable host memory; it needs pinned memory.
    #[error("{operation} from pageable host memory: use pinned memory or the synchronous form")]
    PageableMemory {
        /// The operation refused.
        operation: &'static str,
    },

    /// Memory and a stream (or an event and a stream) of different devices were used together,
    /// which the runtimes refuse.
    #[error("{what} is on device {found}, but the stream is on device {expected}")]
    WrongDevice {
        /// What was on the wrong device (`"memory"`, `"event"`).
        what: &'static str,
        /// The stream's device.
        expected: i32,
        /// The other object's device.
        found: i32,
    },

    /// A raw allocator returned a block that cannot hold what was asked for (too small, null, at
    /// the end of the address space, or on another device). Nothing was lent from it.
    #[error(
        "the raw allocator returned {} at 0x{address:x} on device {block_device} for a request of {} on device {device}",
        Bytes(*size),
        Bytes(*requested)
    )]
    InvalidRawBlock {
        /// The bytes asked for.
        requested: usize,
        /// The device asked for.
        device: i32,
        /// The block's address.
        address: usize,
        /// The block's size.
        size: usize,
        /// The block's device.
        block_device: i32,
    },

    /// An environment variable has a value gpumem cannot use.
    #[error("{variable}={value:?} is not valid: {expected}")]
    InvalidEnvironment {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        value: String,
        /// The accepted forms.
        expected: &'static str,
    },

    /// A host function or callback called an operation that would wait for a stream from a
    /// runtime thread (CUDA refuses every API call there). Nothing was done.
    #[error("{operation} is not allowed inside a host function or stream callback")]
    NotAllowedInCallback {
        /// The operation refused.
        operation: &'static str,
    },

    /// The operation is not allowed while the stream captures (synchronous transfers, host
    /// transfers). The message is CuPy's.
    #[error("{0}")]
    NotAllowedWhileCapturing(&'static str),

    /// A stream was capturing, but an error invalidated the capture sequence.
    #[error("the stream was capturing, but an error has invalidated the capture sequence")]
    CaptureInvalidated,

    /// The operation is not supported on this backend (stream capture on HIP, for instance).
    #[error("{operation} is not supported on the {backend} backend")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// The backend's name.
        backend: &'static str,
    },

    /// A stream was used on a device other than the one it was created on.
    #[error(
        "The device that the stream is created on ({stream_device}) does not match with the current device ({current_device})"
    )]
    StreamDeviceMismatch {
        /// The stream's device.
        stream_device: i32,
        /// The current device.
        current_device: i32,
    },

    /// A memory hook returned an error. The operation was undone (an allocation's memory went
    /// back to the pool), or, for a post-hook, had already completed.
    #[error("memory hook {hook} failed in {phase}: {source}")]
    Hook {
        /// The hook's name.
        hook: String,
        /// The callback (`"malloc_preprocess"`, ...).
        phase: &'static str,
        /// What the hook said.
        #[source]
        source: SharedHookError,
    },

    /// A callback or host function queued on a stream panicked. The panic was caught on the
    /// runtime's thread; it is reported here, at the stream's next `synchronize`.
    #[error("a host callback on this stream panicked: {0}")]
    CallbackPanicked(String),

    /// A memory hook with this name is already registered on this thread.
    #[error("memory hook {0} already exists")]
    HookAlreadyRegistered(String),

    /// The allocator cannot be changed while a `using_allocator` guard is alive on this thread
    /// (CuPy refuses the same).
    #[error("Can't change the global allocator while a `using_allocator` guard is alive on this thread")]
    AllocatorInUse,

    /// The runtime reported an error.
    #[error("{api} failed: {name} ({code}): {message}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The runtime function that failed.
        api: &'static str,
        /// The runtime's numeric code.
        code: i64,
        /// The runtime's name for the code (`CUDA_ERROR_INVALID_VALUE`, `hipErrorInvalidValue`).
        name: String,
        /// The runtime's description of the code.
        message: String,
    },
}

/// The largest size an allocation can have: Rust's bound on the size of any object, far past any
/// device's memory. A larger size is an [`Error::InvalidArgument`], not an out-of-memory.
pub const MAX_ALLOCATION_SIZE: usize = isize::MAX as usize;

impl Error {
    /// The error for a size no allocation can have (see [`Error::InvalidArgument`]).
    #[cold]
    pub(crate) fn size_too_large(size: usize) -> Self {
        Error::InvalidArgument(format!(
            "cannot allocate {size} bytes: no allocation can be larger than {MAX_ALLOCATION_SIZE} bytes"
        ))
    }

    /// Whether this is an out-of-memory condition (raw or against the pool's limit): the kinds a
    /// caller handles by freeing memory and retrying.
    #[must_use]
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. } | Error::LimitExceeded { .. })
    }

    /// A `Backend` error.
    pub fn backend(
        backend: &'static str,
        api: &'static str,
        code: i64,
        name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Backend { backend, api, code, name: name.into(), message: message.into() }
    }

    /// The numeric runtime code, for `Backend` errors.
    #[must_use]
    pub fn code(&self) -> Option<i64> {
        match self {
            Error::Backend { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl Error {
    /// The variant's name, for `Debug`.
    fn variant_name(&self) -> &'static str {
        match self {
            Error::OutOfMemory { .. } => "OutOfMemory",
            Error::LimitExceeded { .. } => "LimitExceeded",
            Error::DriverNotFound { .. } => "DriverNotFound",
            Error::NoDevice { .. } => "NoDevice",
            Error::OutOfBounds { .. } => "OutOfBounds",
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::Overlap { .. } => "Overlap",
            Error::PriorityOutOfRange { .. } => "PriorityOutOfRange",
            Error::NoSuchDevice { .. } => "NoSuchDevice",
            Error::CaptureOnDefaultStream => "CaptureOnDefaultStream",
            Error::PageableMemory { .. } => "PageableMemory",
            Error::WrongDevice { .. } => "WrongDevice",
            Error::InvalidRawBlock { .. } => "InvalidRawBlock",
            Error::InvalidEnvironment { .. } => "InvalidEnvironment",
            Error::NotAllowedInCallback { .. } => "NotAllowedInCallback",
            Error::NotAllowedWhileCapturing(_) => "NotAllowedWhileCapturing",
            Error::CaptureInvalidated => "CaptureInvalidated",
            Error::Unsupported { .. } => "Unsupported",
            Error::StreamDeviceMismatch { .. } => "StreamDeviceMismatch",
            Error::Hook { .. } => "Hook",
            Error::CallbackPanicked(_) => "CallbackPanicked",
            Error::HookAlreadyRegistered(_) => "HookAlreadyRegistered",
            Error::AllocatorInUse => "AllocatorInUse",
            Error::Backend { .. } => "Backend",
        }
    }
}

/// The variant and its message: what `fn main() -> Result<(), Error>` prints when it fails. The
/// message already carries every field a reader needs.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {self}", self.variant_name())
    }
}

/// CuPy's `OutOfMemoryError` message: `{:,}` thousands separators, and the trailing period only
/// where CuPy puts one.
fn out_of_memory_message(size: usize, total: Option<usize>, limit: usize) -> String {
    match (total, limit) {
        (None, _) => format!("Out of memory allocating {}", Bytes(size)),
        (Some(total), 0) => {
            format!("Out of memory allocating {} (allocated so far: {}).", Bytes(size), Bytes(total))
        }
        (Some(total), limit) => format!(
            "Out of memory allocating {} (allocated so far: {}, limit set to: {}).",
            Bytes(size),
            Bytes(total),
            Bytes(limit)
        ),
    }
}

/// The operations whose `size` is a host slice's length rather than device memory's
/// (`runtime/transfer.rs` names them so).
const HOST_SLICE_OPERATIONS: [&str; 2] = ["copy_from_host source", "copy_to_host destination"];

/// `OutOfBounds`'s message: what was refused, against the memory it names (an allocation or a
/// host slice); an offset alone (`len` 0) is said as such rather than as "0 bytes".
fn out_of_bounds_message(operation: &str, offset: isize, len: usize, size: usize) -> String {
    if HOST_SLICE_OPERATIONS.contains(&operation) {
        return format!("out of bounds: {operation} of {} from a host slice of {}", Bytes(len), Bytes(size));
    }
    if len == 0 {
        return format!("out of bounds: {operation} {offset} is outside an allocation of {}", Bytes(size));
    }
    format!(
        "out of bounds: {operation} of {} at offset {offset} of an allocation of {}",
        Bytes(len),
        Bytes(size)
    )
}

/// A byte count as a reader says it: `1 byte`, `1,024 bytes` (thousands separated as Python's `{:,}`).
pub(crate) struct Bytes(pub usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = if self.0 == 1 { "byte" } else { "bytes" };
        write!(f, "{} {unit}", Thousands(self.0))
    }
}

/// Formats an integer with `,` between groups of three digits, as Python's `{:,}`.
pub(crate) struct Thousands(pub usize);

impl fmt::Display for Thousands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        let mut out = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, c) in digits.chars().enumerate() {
            if i != 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators_match_python() {
        for (n, s) in [
            (0, "0"),
            (7, "7"),
            (512, "512"),
            (1000, "1,000"),
            (65536, "65,536"),
            (805_306_368, "805,306,368"),
            (1_073_741_824, "1,073,741,824"),
            (100_000, "100,000"),
            (usize::MAX, "18,446,744,073,709,551,615"),
        ] {
            assert_eq!(Thousands(n).to_string(), s, "{n}");
        }
    }

    #[test]
    fn out_of_memory_messages_match_cupy() {
        let limited = Error::LimitExceeded { size: 805_306_368, total: 536_870_912, limit: 1_073_741_824 };
        assert_eq!(
            limited.to_string(),
            "Out of memory allocating 805,306,368 bytes (allocated so far: 536,870,912 bytes, limit set to: 1,073,741,824 bytes)."
        );
        let raw = Error::OutOfMemory { size: 1024, total: Some(2048) };
        assert_eq!(raw.to_string(), "Out of memory allocating 1,024 bytes (allocated so far: 2,048 bytes).");
        let unknown = Error::OutOfMemory { size: 1024, total: None };
        assert_eq!(unknown.to_string(), "Out of memory allocating 1,024 bytes");
        assert!(limited.is_out_of_memory() && raw.is_out_of_memory());
        assert!(!Error::size_too_large(usize::MAX).is_out_of_memory());
    }

    #[test]
    fn debug_prints_the_variant_and_its_message() {
        let limited = Error::LimitExceeded { size: 1024, total: 2048, limit: 4096 };
        assert_eq!(
            format!("{limited:?}"),
            "LimitExceeded: Out of memory allocating 1,024 bytes (allocated so far: 2,048 bytes, limit set to: 4,096 bytes)."
        );
        let missing = Error::DriverNotFound { backend: "cuda", detail: "libcuda.so.1 not found".into() };
        assert_eq!(format!("{missing:?}"), format!("DriverNotFound: {missing}"));
        assert_eq!(
            format!("{:?}", Error::CaptureInvalidated),
            format!("CaptureInvalidated: {}", Error::CaptureInvalidated)
        );
        let hook = Error::Hook {
            hook: "h".into(),
            phase: "malloc_preprocess",
            source: HookError::from("refused").into(),
        };
        assert_eq!(format!("{hook:?}"), "Hook: memory hook h failed in malloc_preprocess: refused");
    }
    #[test]
    fn byte_counts_read_as_words() {
        assert_eq!(Bytes(1).to_string(), "1 byte");
        assert_eq!(Bytes(0).to_string(), "0 bytes");
        assert_eq!(Bytes(4096).to_string(), "4,096 bytes");
        let limit = Error::LimitExceeded { size: 1, total: 1024, limit: 1 };
        assert!(limit.to_string().ends_with("limit set to: 1 byte)."), "{limit}");
        let memset = Error::OutOfBounds { operation: "memset", offset: 1023, len: 1, size: 1024 };
        assert_eq!(
            memset.to_string(),
            "out of bounds: memset of 1 byte at offset 1023 of an allocation of 1,024 bytes"
        );
        let slice = Error::OutOfBounds { operation: "copy_from_host source", offset: 0, len: 8, size: 4 };
        assert_eq!(
            slice.to_string(),
            "out of bounds: copy_from_host source of 8 bytes from a host slice of 4 bytes"
        );
        let offset =
            Error::OutOfBounds { operation: "MemoryPointer offset", offset: 1 << 40, len: 0, size: 512 };
        assert_eq!(
            offset.to_string(),
            "out of bounds: MemoryPointer offset 1099511627776 is outside an allocation of 512 bytes"
        );
    }
}
