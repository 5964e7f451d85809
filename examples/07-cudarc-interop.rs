//! gpumem beside cudarc: a kernel compiled at run time with NVRTC and launched on gpumem memory,
//! on a gpumem stream; the result read through a cudarc view of the same memory; a cudarc stream
//! used by gpumem.
//!
//! Needs an NVIDIA GPU and the CUDA toolkit's NVRTC library (libnvrtc) at run time:
//!
//! ```text
//! cargo run --example 07-cudarc-interop --features cudarc-cuda-12000,nvrtc
//! ```

use std::error::Error;

use gpumem::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use gpumem::cuda::cudarc::nvrtc::compile_ptx;
use gpumem::cuda::interop::{self, kernel_arg, CudarcSlice};
use gpumem::cuda::Cuda;

// cudarc's side needs CUDA's types, so the example names the CUDA backend rather than the
// facade's aliases (which name the run-time choice under the `auto` feature).
type Device = gpumem::core::Device<Cuda>;
type DeviceBuffer<T> = gpumem::core::DeviceBuffer<T, Cuda>;
type Stream = gpumem::core::Stream<Cuda>;

/// `y = a * x + y`, one thread per element.
const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
"#;

fn main() -> Result<(), Box<dyn Error>> {
    const N: u32 = 1 << 20;
    let device = Device::current();
    println!("device {}: {}", device.id(), device.properties()?.name);

    // gpumem memory, from the default pool.
    let host_x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let x = DeviceBuffer::<f32>::from_slice(&host_x)?;
    let y = DeviceBuffer::<f32>::from_elem(1.0, N as usize)?;

    // The kernel, compiled with NVRTC and loaded into the device's primary context (gpumem's).
    let ctx = interop::context(device.id())?;
    let module = ctx.load_module(compile_ptx(SAXPY)?)?;
    let saxpy = module.load_function("saxpy")?;

    // Launched on a gpumem stream, with gpumem buffers as its pointer arguments.
    let stream = Stream::non_blocking()?;
    interop::with_cudarc_stream(&stream, |cs| {
        let (a, n) = (2.0f32, N);
        let (xa, ya) = (kernel_arg(&x), kernel_arg(&y));
        let mut launch = cs.launch_builder(&saxpy);
        launch.arg(&a).arg(&xa).arg(&ya).arg(&n);
        // SAFETY: the kernel's parameters are (float, const float*, float*, unsigned int), as
        // pushed; `x` and `y` hold `N` floats each and outlive the launch (the stream is
        // synchronised below, before they are dropped).
        unsafe { launch.launch(LaunchConfig::for_num_elems(N)) }
            .map_err(|e| interop::driver_error("cuLaunchKernel", &e))?;
        Ok(())
    })?;
    stream.synchronize()?;

    // Read back through gpumem, and through a cudarc view of the same memory that never frees it.
    let back = y.to_vec()?;
    let wrong = back.iter().enumerate().filter(|&(i, &v)| v != 2.0 * i as f32 + 1.0).count();
    let via_cudarc = interop::with_cudarc_stream(&stream, |cs| {
        let view = CudarcSlice::new(&y, cs);
        cs.clone_dtoh(&*view).map_err(|e| interop::driver_error("cuMemcpyDtoHAsync", &e))
    })?;
    println!(
        "saxpy on {N} elements: {wrong} wrong; y[0] = {}, y[{}] = {}; cudarc reads the same: {}",
        back[0],
        N - 1,
        back[N as usize - 1],
        via_cudarc == back
    );

    // A stream cudarc owns, used by gpumem: gpumem keeps cudarc's handle alive and never
    // destroys it; cudarc destroys it once, after both are dropped.
    let cudarc_stream = ctx.new_stream()?;
    let theirs = interop::stream_from_cudarc(&cudarc_stream)?;
    y.fill_async(0.0, Some(&theirs))?;
    theirs.synchronize()?;
    let zeroed = y.to_vec()?.iter().all(|&v| v == 0.0);
    println!("memset on cudarc's stream through gpumem: {}", if zeroed { "ok" } else { "WRONG" });
    drop(theirs);
    drop(cudarc_stream);

    let pool = gpumem::get_default_memory_pool();
    println!("pool: {} bytes used, {} bytes held", pool.used_bytes(), pool.total_bytes());
    if wrong != 0 || via_cudarc != back || !zeroed {
        return Err("results differ from the expected values".into());
    }
    println!("ok");
    Ok(())
}
