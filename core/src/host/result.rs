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

/// A host backend error for `api` (named in the code as the CUDA driver call it stands for). The
/// error names the host operation instead (the backend contract's function, `event_elapsed_ms`):
/// a program on the CPU has called no CUDA function.
pub(crate) fn err(api: &'static str, code: Code, detail: Option<String>) -> Error {
    let message = match detail {
        Some(d) => format!("{}: {d}", code.text()),
        None => code.text().to_owned(),
    };
    Error::backend("host", operation(api), code as i64, code.name(), message)
}

/// The backend contract's name for the host operation that stands for CUDA's `api`.
fn operation(api: &'static str) -> &'static str {
    match api {
        "cuCtxEnablePeerAccess" => "enable_peer_access",
        "cuCtxGetStreamPriorityRange" => "stream_priority_range",
        "cuCtxSetCurrent" => "set_device",
        "cuCtxSynchronize" => "device_synchronize",
        "cuDeviceCanAccessPeer" => "can_access_peer",
        "cuDeviceGetAttribute" => "device_properties",
        "cuEventCreate" => "event_create",
        "cuEventElapsedTime" => "event_elapsed_ms",
        "cuEventQuery" => "event_query",
        "cuEventRecord" => "event_record",
        "cuEventSynchronize" => "event_synchronize",
        "cuGraphLaunch" => "graph_launch",
        "cuGraphUpload" => "graph_upload",
        "cuLaunchHostFunc" => "launch_host_func",
        "cuMemAddressFree" => "vm_free_range",
        "cuMemAddressReserve" => "vm_reserve",
        "cuMemAlloc" => "malloc",
        "cuMemAllocAsync" => "malloc_async",
        "cuMemCreate" => "vm_create",
        "cuMemFree" => "free",
        "cuMemFreeAsync" => "free_async",
        "cuMemFreeHost" => "free_host",
        "cuMemGetAllocationGranularity" => "vm_granularity",
        "cuMemGetInfo" => "mem_get_info",
        "cuMemHostAlloc" => "malloc_host",
        "cuMemMap" => "vm_map",
        "cuMemPoolGetAttribute" => "async_pool_attribute",
        "cuMemPoolSetAttribute" => "async_pool_set_release_threshold",
        "cuMemPoolTrimTo" => "async_pool_trim_to",
        "cuMemRelease" => "vm_release",
        "cuMemSetAccess" => "vm_set_access",
        "cuMemUnmap" => "vm_unmap",
        "cuMemcpy" => "memcpy",
        "cuMemcpyAsync" => "memcpy_async",
        "cuMemsetD8" => "memset",
        "cuMemsetD8Async" => "memset_async",
        "cuStreamAddCallback" => "add_callback",
        "cuStreamBeginCapture" => "begin_capture",
        "cuStreamCreate" => "stream_create",
        "cuStreamCreateWithPriority" => "stream_create",
        "cuStreamDestroy" => "stream_destroy",
        "cuStreamEndCapture" => "end_capture",
        "cuStreamGetCaptureInfo" => "capture_status",
        "cuStreamGetFlags" => "stream_flags",
        "cuStreamGetPriority" => "stream_priority",
        "cuStreamQuery" => "stream_query",
        "cuStreamSynchronize" => "stream_synchronize",
        "cuStreamWaitEvent" => "stream_wait_event",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_name_host_operations() {
        let e = err("cuEventElapsedTime", Code::InvalidHandle, Some("not recorded".into()));
        assert_eq!(
            e.to_string(),
            "event_elapsed_ms failed: HOST_ERROR_INVALID_HANDLE (400): invalid resource handle: not recorded"
        );
        let e = err("cuStreamEndCapture", Code::IllegalState, None);
        assert!(e.to_string().starts_with("end_capture failed: "), "{e}");
    }
}
