//! cudarc interop on a GPU (the `cudarc` feature): streams both ways, slices that never free,
//! typed buffers through cudarc copies. Ignored without a GPU.
#![cfg(feature = "cudarc")]

use gpumem_core::{Device, DeviceBuffer, Stream};
use gpumem_cuda::interop::{self, CudarcSlice};
use gpumem_cuda::Cuda;

fn require_gpu() {
    if let Err(e) = Device::<Cuda>::count() {
        panic!("this test needs an NVIDIA GPU with its driver, and found none: {e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn gpumem_stream_as_cudarc_stream() {
    require_gpu();
    let stream = Stream::<Cuda>::non_blocking().unwrap();
    let buf = DeviceBuffer::<u32, Cuda>::from_slice(&[1, 2, 3, 4]).unwrap();
    let back = interop::with_cudarc_stream(&stream, |cs| {
        assert_eq!(cs.cu_stream().cast::<u8>(), stream.handle().as_raw().cast::<u8>());
        let view = CudarcSlice::new(&buf, cs);
        Ok(cs.clone_dtoh(&*view).unwrap())
    })
    .unwrap();
    assert_eq!(back, [1, 2, 3, 4]);
    // The stream is still gpumem's and usable; dropping it destroys it once.
    buf.fill_async(9, Some(&stream)).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), [9; 4]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn an_escaped_cudarc_stream_keeps_the_gpumem_stream() {
    require_gpu();
    let stream = Stream::<Cuda>::non_blocking().unwrap();
    let kept = interop::with_cudarc_stream(&stream, |cs| Ok(std::sync::Arc::clone(cs))).unwrap();
    drop(stream);
    // The handle cudarc kept is still a live stream.
    kept.synchronize().unwrap();
    let buf = DeviceBuffer::<u8, Cuda>::zeros(16).unwrap();
    let view = CudarcSlice::new(&buf, &kept);
    assert_eq!(kept.clone_dtoh(&*view).unwrap(), [0; 16]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn cudarc_stream_as_gpumem_stream() {
    require_gpu();
    let ctx = interop::context(0).unwrap();
    let theirs = ctx.new_stream().unwrap();
    let stream = interop::stream_from_cudarc(&theirs).unwrap();
    assert!(!stream.is_owned());
    let buf = DeviceBuffer::<f32, Cuda>::zeros(1000).unwrap();
    buf.fill_async(0.25, Some(&stream)).unwrap();
    // cudarc's last `Arc` outside gpumem goes first: the stream lives on in gpumem's.
    drop(theirs);
    stream.synchronize().unwrap();
    assert_eq!(buf.to_vec().unwrap(), vec![0.25; 1000]);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a machine with one"]
fn a_cudarc_slice_never_frees_pool_memory() {
    require_gpu();
    let stream = Stream::<Cuda>::non_blocking().unwrap();
    let buf = DeviceBuffer::<u64, Cuda>::from_slice(&[7; 512]).unwrap();
    interop::with_cudarc_stream(&stream, |cs| {
        for _ in 0..100 {
            let mut view = CudarcSlice::new(&buf, cs);
            cs.memcpy_htod(&[3u64; 512], &mut view.view_mut()).unwrap();
            drop(view);
        }
        cs.synchronize().unwrap();
        Ok(())
    })
    .unwrap();
    // Had a drop freed the address, the driver would refuse it here or the pool hand it out
    // twice; the pool's chunk is intact and still its.
    assert_eq!(buf.to_vec().unwrap(), vec![3; 512]);
    let other = DeviceBuffer::<u64, Cuda>::zeros(512).unwrap();
    assert_ne!(other.device_ptr(), buf.device_ptr());
}
