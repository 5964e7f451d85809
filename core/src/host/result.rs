//! The host backend's error codes. They take CUDA's numbers, so code that matches on
//! [`Error::code`](crate::Error::code) sees the same value on the host as on an NVIDIA GPU.

use crate::error::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidValue = 1,
    InvalidDevice = 101,
    InvalidHandle = 400,
    IllegalState = 401,
    NotReady = 600,
    OutOfResources = 701,
    NotPermitted = 800,
    StreamCaptureUnsupported = 900,
    StreamCaptureInvalidated = 901,
    StreamCaptureMerge = 902,
    StreamCaptureUnmatched = 903,
    StreamCaptureUnjoined = 904,
    StreamCaptureIsolation = 905,
    StreamCaptureImplicit = 906,
    CapturedEvent = 907,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Code::InvalidValue => "HOST_ERROR_INVALID_VALUE",
            Code::InvalidDevice => "HOST_ERROR_INVALID_DEVICE",
            Code::InvalidHandle => "HOST_ERROR_INVALID_HANDLE",
            Code::IllegalState => "HOST_ERROR_ILLEGAL_STATE",
            Code::NotReady => "HOST_ERROR_NOT_READY",
            Code::OutOfResources => "HOST_ERROR_LAUNCH_OUT_OF_RESOURCES",
            Code::NotPermitted => "HOST_ERROR_NOT_PERMITTED",
            Code::StreamCaptureUnsupported => "HOST_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            Code::StreamCaptureInvalidated => "HOST_ERROR_STREAM_CAPTURE_INVALIDATED",
            Code::StreamCaptureMerge => "HOST_ERROR_STREAM_CAPTURE_MERGE",
            Code::StreamCaptureUnmatched => "HOST_ERROR_STREAM_CAPTURE_UNMATCHED",
            Code::StreamCaptureUnjoined => "HOST_ERROR_STREAM_CAPTURE_UNJOINED",
            Code::StreamCaptureIsolation => "HOST_ERROR_STREAM_CAPTURE_ISOLATION",
            Code::StreamCaptureImplicit => "HOST_ERROR_STREAM_CAPTURE_IMPLICIT",
            Code::CapturedEvent => "HOST_ERROR_CAPTURED_EVENT",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Code::InvalidValue => "invalid argument",
            Code::InvalidDevice => "invalid device ordinal",
            Code::InvalidHandle => "invalid resource handle",
            Code::IllegalState => "the operation cannot be performed in the present state",
            Code::NotReady => "device not ready",
            Code::OutOfResources => "too many resources requested",
            Code::NotPermitted => "operation not permitted",
            Code::StreamCaptureUnsupported => "operation not permitted when stream is capturing",
            Code::StreamCaptureInvalidated => "operation failed due to a previous error during capture",
            Code::StreamCaptureMerge => {
                "operation would have resulted in a merge of two independent captures"
            }
            Code::StreamCaptureUnmatched => "the capture was not initiated in this stream",
            Code::StreamCaptureUnjoined => {
                "the capture sequence contains a fork that was not joined to the primary stream"
            }
            Code::StreamCaptureIsolation => {
                "dependency would cross the capture sequence boundary (an event recorded outside the capture)"
            }
            Code::StreamCaptureImplicit => {
                "operation would make the legacy stream depend on a capturing blocking stream"
            }
            Code::CapturedEvent => "operation not permitted on an event last recorded in a capturing stream",
        }
    }
}

/// A host backend error for `api` (named as the CUDA driver call it stands for).
pub(crate) fn err(api: &'static str, code: Code, detail: Option<String>) -> Error {
    let message = match detail {
        Some(d) => format!("{}: {d}", code.text()),
        None => code.text().to_owned(),
    };
    Error::backend("host", api, code as i64, code.name(), message)
}
